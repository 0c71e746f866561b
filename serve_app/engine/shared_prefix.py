"""Requests that share a prefix and arrive together compute it once.

vLLM's prefix cache holds a block once a request has computed it; requests scheduled in the
same step as the first one find nothing yet and compute the shared prefix again (an evaluation
harness sends the choices of one question at the same moment). So a request whose cacheable
prefix is mostly a prefix another request is computing now waits for that one to finish, then
reads it from the cache. Waiting never changes an answer: only what vLLM reads from its cache.

An online request never waits for a background one (a batch line, a dataset document), which
may itself wait long for the engine (serve_app.engine.background): it computes the prefix
itself and takes it over, so that the online requests after it wait for it instead.
"""

import asyncio
import contextlib
from dataclasses import dataclass, field


@dataclass
class InFlight:
    background: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def holds_back(self, background: bool) -> bool:
        """Whether a request (background or online) waits for this one's prefix."""
        return background or not self.background


def block_keys(token_ids: list[int], block_size: int, tokens: int, namespace: str = "") -> list[int]:
    """One key per whole block of `token_ids[:tokens]`, each standing for the namespace and the
    whole prefix up to that block's end (a chain, as vLLM hashes its blocks)."""
    keys, key = [], hash(namespace)
    for end in range(block_size, tokens + 1, block_size):
        key = hash((key, tuple(token_ids[end - block_size:end])))
        keys.append(key)
    return keys


class InFlightPrefixes:
    """The prefixes being computed now, by whole blocks; `turn` waits for a request's."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.computing: dict[int, InFlight] = {}

    def leader(self, keys: list[int], background: bool) -> tuple[InFlight | None, int]:
        """The in-flight request computing the longest of these prefixes that a request
        (background or online) waits for, and its blocks."""
        for blocks in range(len(keys), 0, -1):
            holder = self.computing.get(keys[blocks - 1])
            if holder is not None and holder.holds_back(background):
                return holder, blocks
        return None, 0

    def free_for(self, key: int, background: bool) -> bool:
        """Whether a request may hold this prefix as in flight: none does, or only a
        background one and the request is online."""
        holder = self.computing.get(key)
        return holder is None or not holder.holds_back(background)

    @contextlib.asynccontextmanager
    async def turn(self, token_ids: list[int], readable: int, leads: bool, namespace: str = "",
                   background: bool = False):
        """Waits, if a request of the namespace computing now covers at least half of these
        tokens' prompt within the `readable` first ones (what this request may read from the
        cache), for it to end, unless this one is online and that one background; then, if
        it `leads` (its end comes soon after its prefill: a scoring request), holds its own
        blocks as in flight until the block exits, an online request those a background one
        holds too."""
        readable_keys = block_keys(token_ids, self.block_size, readable, namespace)
        leader, blocks = self.leader(readable_keys, background)
        if leader is not None and 2 * blocks * self.block_size >= len(token_ids):
            await leader.done.wait()
        mine = InFlight(background)
        prefixes = block_keys(token_ids, self.block_size, len(token_ids), namespace) if leads else []
        keys = [k for k in prefixes if self.free_for(k, background)]
        self.computing.update(dict.fromkeys(keys, mine))
        try:
            yield
        finally:
            mine.done.set()
            for key in keys:
                if self.computing.get(key) is mine:
                    del self.computing[key]
