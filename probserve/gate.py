"""A bounded place to wait: at most `bound` holders at once; beyond, a caller waits for a
place, refused when too many already wait or its wait runs out. The tenants' in-flight queues
and the ingress's full-vocabulary slots are such gates, each with its own refusal."""

import asyncio
from collections.abc import Callable


class Gate:
    def __init__(self, bound: int, on_waiting: Callable[[int], None] = lambda change: None):
        """`on_waiting(+1 or -1)` follows the number waiting (a gauge)."""
        self.bound = bound
        self.places = asyncio.Semaphore(bound)
        self.waiting = 0
        self.on_waiting = on_waiting

    async def enter(self, max_waiting: int, wait_s: float,
                    refusal: Callable[["Gate"], Exception]) -> Callable[[], None]:
        """A place, waiting for one if need be, else `refusal(self)` raised; returns the
        place's release, which only its first call does."""
        if self.places.locked() and self.waiting >= max_waiting:
            raise refusal(self)
        self.waiting += 1
        self.on_waiting(1)
        try:
            await asyncio.wait_for(self.places.acquire(), wait_s)
        except TimeoutError:
            raise refusal(self) from None
        finally:
            self.waiting -= 1
            self.on_waiting(-1)
        return once(self.places.release)


def once(action: Callable[[], object]) -> Callable[[], None]:
    """`action`, run by the first call only."""
    done = False

    def run() -> None:
        nonlocal done
        if not done:
            done = True
            action()
    return run
