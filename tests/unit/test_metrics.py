"""Held gauges: set again with their last values while nothing changes them, each series on
its own, never a stale value after a new one, and no more once the process has left Ray."""

import threading
import time

import pytest

from serve_app.observe.metrics import HeldGauges

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


class InRay:
    """Whether the process is in Ray, as the held gauges ask it."""

    def __init__(self):
        self.left = threading.Event()

    def __call__(self) -> bool:
        return not self.left.is_set()


@pytest.fixture
def in_ray():
    """The held gauges of a test, whose refreshers end with it."""
    state = InRay()
    yield state
    state.left.set()


def held_gauges(in_ray: InRay, period_s: float = PERIOD_S) -> HeldGauges:
    return HeldGauges(period_s=lambda: period_s, connected=in_ray)


def wait_for(condition, timeout_s: float = 5) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the held gauges were not set again"
        time.sleep(PERIOD_S)


def test_a_gauge_set_once_is_set_again_with_its_value_and_tags(in_ray):
    held, gauge = held_gauges(in_ray), RecordedGauge()
    held.set(gauge, 3, {"model": "m"})
    wait_for(lambda: len(gauge.after(1)) >= 3)
    assert set(map(repr, gauge.after(0))) == {repr((3, {"model": "m"}))}


def test_each_series_is_held_with_its_last_value(in_ray):
    held = held_gauges(in_ray)
    running, waiting = RecordedGauge(), RecordedGauge()
    held.set(running, 1, {"model": "a"})
    held.set(running, 2, {"model": "b"})
    held.set(running, 0, {"model": "a"})
    held.set(waiting, 5, {"model": "a"})
    count = len(running.sets)
    wait_for(lambda: len(running.after(count)) >= 4)
    assert {(value, tags["model"]) for value, tags in running.after(count)} == {(0, "a"), (2, "b")}
    assert {value for value, _ in waiting.after(1)} == {5}


def test_a_refresh_never_sets_an_older_value_after_a_newer_one(in_ray):
    held, gauge = held_gauges(in_ray, period_s=0.001), RecordedGauge()
    for value in range(2000):
        held.set(gauge, value, {})
        time.sleep(0.00001)
    values = [value for value, _ in gauge.after(0)]
    assert all(later >= earlier for earlier, later in zip(values, values[1:]))


def test_one_thread_refreshes_every_gauge_of_a_process(in_ray):
    held, refreshers = held_gauges(in_ray), set()
    for _ in range(5):
        held.set(RecordedGauge(), 1, {})
        refreshers.add(held.refresher)
    assert len(refreshers) == 1 and held.refresher.is_alive()
    assert held.refresher.daemon  # it never keeps a process from exiting


def test_nothing_is_set_once_the_process_has_left_ray(in_ray):
    held, gauge = held_gauges(in_ray), RecordedGauge()
    held.set(gauge, 1, {})
    refresher = held.refresher
    wait_for(lambda: len(gauge.after(1)) >= 1)
    in_ray.left.set()
    refresher.join(timeout=5)
    assert not refresher.is_alive()
    count = len(gauge.sets)
    time.sleep(5 * PERIOD_S)
    assert len(gauge.sets) == count
    assert held.held == {} and held.refresher is None
