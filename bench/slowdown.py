"""An engine made slower on purpose, as a machine a fraction as fast (or a neighbour taking its
cores) would leave it: its processes stopped for most of every period and let run the rest
(SIGSTOP, SIGCONT). bench/burst.py and tests/e2e/test_answer_bound.py slow vLLM's so."""

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psutil


@contextmanager
def slowed(processes: list[psutil.Process], running_share: float, period_s: float = 0.05) -> Iterator[None]:
    """The processes run `running_share` of every `period_s`, stopped the rest, until the block
    ends; then they run freely again. A share of 1 leaves them alone."""
    if running_share >= 1:
        yield
        return
    done = threading.Event()

    def each(action: str) -> None:
        for process in processes:
            getattr(process, action)()

    def cycle() -> None:
        while not done.is_set():
            each("suspend")
            time.sleep(period_s * (1 - running_share))
            each("resume")
            time.sleep(period_s * running_share)
    thread = threading.Thread(target=cycle, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        each("resume")


def vllm_processes() -> list[psutil.Process]:
    """vLLM's engine processes on this machine (engine cores and workers: `VLLM::...`)."""
    return [process for process in psutil.process_iter(["name"])
            if (process.info["name"] or "").startswith("VLLM")]
