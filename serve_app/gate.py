"""A bounded place to wait: at most `bound` holders at once; beyond, a caller waits for a
place, refused when too many already wait or its wait runs out. The tenants' in-flight queues
and the ingress's full-vocabulary slots are such gates, each with its own refusal.

anyio's CapacityLimiter keeps the count exact under a burst: a free place is taken without
yielding to the event loop, and a release hands its place to the first waiter at once, so a
caller given a place is never still counted as waiting."""

from collections.abc import Callable

import anyio


class Gate:
    def __init__(self, bound: int, on_waiting: Callable[[int], None] = lambda change: None):
        """`on_waiting(+1 or -1)` follows the number waiting (a gauge)."""
        self.bound = bound
        self.places = anyio.CapacityLimiter(bound)
        self.on_waiting = on_waiting

    def resize(self, bound: int) -> None:
        """A new bound: places beyond it go to waiters at once; below the places held, the
        next holders' releases are not handed on until they are within it."""
        self.bound = self.places.total_tokens = bound

    @property
    def waiting(self) -> int:
        return self.places.statistics().tasks_waiting

    @property
    def held(self) -> int:
        return self.places.borrowed_tokens

    async def enter(self, max_waiting: int, wait_s: float,
                    refusal: Callable[["Gate"], Exception]) -> Callable[[], None]:
        """A place, waiting for one if need be, else `refusal(self)` raised; returns the
        place's release, which only its first call does."""
        holder = object()
        try:
            self.places.acquire_on_behalf_of_nowait(holder)
        except anyio.WouldBlock:
            if self.waiting >= max_waiting:
                raise refusal(self) from None
            await self.wait(holder, wait_s, refusal)
        return once(lambda: self.places.release_on_behalf_of(holder))

    async def wait(self, holder: object, wait_s: float, refusal: Callable[["Gate"], Exception]) -> None:
        self.on_waiting(1)
        try:
            with anyio.fail_after(wait_s):
                await self.places.acquire_on_behalf_of(holder)
        except TimeoutError:
            raise refusal(self) from None
        finally:
            self.on_waiting(-1)


def once(action: Callable[[], object]) -> Callable[[], None]:
    """`action`, run by the first call only."""
    done = False

    def run() -> None:
        nonlocal done
        if not done:
            done = True
            action()
    return run
