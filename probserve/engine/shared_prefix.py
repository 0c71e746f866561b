"""Requests that share a prefix and arrive together compute it once.

vLLM's prefix cache holds a block once a request has computed it; requests scheduled in the
same step as the first one find nothing yet and compute the shared prefix again (an evaluation
harness sends the choices of one question at the same moment). So a request whose cacheable
prefix is mostly a prefix another request is computing now waits for that one to finish, then
reads it from the cache. Waiting never changes an answer: only what vLLM reads from its cache.
"""

import asyncio
import contextlib
from dataclasses import dataclass, field


@dataclass
class InFlight:
    done: asyncio.Event = field(default_factory=asyncio.Event)


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

    def leader(self, keys: list[int]) -> tuple[InFlight | None, int]:
        """The in-flight request computing the longest of these prefixes, and its blocks."""
        for blocks in range(len(keys), 0, -1):
            if keys[blocks - 1] in self.computing:
                return self.computing[keys[blocks - 1]], blocks
        return None, 0

    @contextlib.asynccontextmanager
    async def turn(self, token_ids: list[int], readable: int, leads: bool, namespace: str = ""):
        """Waits, if a request of the namespace computing now covers at least half of these
        tokens' prompt within the `readable` first ones (what this request may read from the
        cache), for it to end; then, if it `leads` (its end comes soon after its prefill: a
        scoring request), holds its own blocks as in flight until the block exits."""
        readable_keys = block_keys(token_ids, self.block_size, readable, namespace)
        leader, blocks = self.leader(readable_keys)
        if leader is not None and 2 * blocks * self.block_size >= len(token_ids):
            await leader.done.wait()
        mine = InFlight()
        prefixes = block_keys(token_ids, self.block_size, len(token_ids), namespace) if leads else []
        keys = [k for k in prefixes if k not in self.computing]
        self.computing.update(dict.fromkeys(keys, mine))
        try:
            yield
        finally:
            mine.done.set()
            for key in keys:
                del self.computing[key]
