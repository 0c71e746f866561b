"""Waiting for what a test needs to have happened, instead of sleeping for as long as it
usually takes: a condition polled under a deadline that fails the test, or a reading polled
until it stops changing."""

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
SETTLE_S = 30
REPORT_S = 2.5  # Ray's metrics report interval in the tests, and a little


def poll_until(condition: Callable[[], T], limit_s: float, what: str, pause_s: float = 0.1) -> T:
    """`condition()`'s first true value; the test fails if none comes within `limit_s`."""
    return read_until(condition, bool, limit_s, what, pause_s)


def read_until(read: Callable[[], T], done: Callable[[T], bool], limit_s: float, what: str,
               pause_s: float = 0.1) -> T:
    """`read()`'s first value that `done` holds of; the test fails, showing the last value
    read, if none comes within `limit_s`."""
    deadline = time.monotonic() + limit_s
    while not done(value := read()):
        assert time.monotonic() < deadline, f"{what}: not within {limit_s:g} s (last read: {value!r})"
        time.sleep(pause_s)
    return value


def settled_reading(read: Callable[[], T], pause_s: float = REPORT_S, limit_s: float = SETTLE_S) -> T:
    """`read()` once a reading `pause_s` after the one before brings nothing new (a counter
    that Ray's metrics agent reports every 2 s has stopped growing), or after `limit_s`."""
    deadline, value = time.monotonic() + limit_s, read()
    while time.monotonic() < deadline:
        time.sleep(pause_s)
        value, previous = read(), value
        if value == previous:
            break
    return value
