"""Held gauges: set again with their last values while nothing changes them, each series on
its own, never a stale value after a new one."""

import threading
import time

from probserve.observe.metrics import HeldGauges

PERIOD_S = 0.01


class RecordedGauge:
    """What Ray's gauge was set to, without Ray."""

    def __init__(self):
        self.sets: list[tuple[float, dict[str, str]]] = []
        self.lock = threading.Lock()

    def set(self, value: float, tags: dict[str, str]) -> None:
        with self.lock:
            self.sets.append((value, dict(tags)))

    def after(self, count: int) -> list[tuple[float, dict[str, str]]]:
        with self.lock:
            return self.sets[count:]


def wait_for(condition, timeout_s: float = 5) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the held gauges were not set again"
        time.sleep(PERIOD_S)


def test_a_gauge_set_once_is_set_again_with_its_value_and_tags():
    held, gauge = HeldGauges(period_s=lambda: PERIOD_S), RecordedGauge()
    held.set(gauge, 3, {"model": "m"})
    wait_for(lambda: len(gauge.after(1)) >= 3)
    assert set(map(repr, gauge.after(0))) == {repr((3, {"model": "m"}))}


def test_each_series_is_held_with_its_last_value():
    held = HeldGauges(period_s=lambda: PERIOD_S)
    running, waiting = RecordedGauge(), RecordedGauge()
    held.set(running, 1, {"model": "a"})
    held.set(running, 2, {"model": "b"})
    held.set(running, 0, {"model": "a"})
    held.set(waiting, 5, {"model": "a"})
    count = len(running.sets)
    wait_for(lambda: len(running.after(count)) >= 4)
    assert {(value, tags["model"]) for value, tags in running.after(count)} == {(0, "a"), (2, "b")}
    assert {value for value, _ in waiting.after(1)} == {5}


def test_a_refresh_never_sets_an_older_value_after_a_newer_one():
    held, gauge = HeldGauges(period_s=lambda: 0.001), RecordedGauge()
    for value in range(2000):
        held.set(gauge, value, {})
        time.sleep(0.00001)
    values = [value for value, _ in gauge.after(0)]
    assert all(later >= earlier for earlier, later in zip(values, values[1:]))


def test_one_thread_refreshes_every_gauge_of_a_process():
    held = HeldGauges(period_s=lambda: PERIOD_S)
    before = threading.active_count()
    for _ in range(5):
        held.set(RecordedGauge(), 1, {})
    assert threading.active_count() == before + 1
    assert held.refresher.daemon  # it never keeps a process from exiting
