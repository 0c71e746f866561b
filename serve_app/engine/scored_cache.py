"""The scored-prefix cache: prompt rows (each position's token logprob and rank, and its top-k
up to a configured k) kept for token prefixes a model replica has scored, so that a request
scoring a prompt from its start (echo, `prompt_logprobs: k`) gets the rows of a known prefix
from here and has the engine compute only the rest, reading the prefix's KV from vLLM's cache.

Rows go by blocks of the engine's KV block size B: entry b holds the rows of positions
bB + 1 .. (b + 1)B, which depend on tokens 0 .. (b + 1)B, so its key chains every token up to
there (with the namespace: a tenant's own by default, so that no tenant can time whether
another sent a prompt). An entry keeps its tokens and is served only if they match: a hash
collision computes, it never answers wrongly. With rows known up to position nB, the engine
request reads at most nB tokens from the KV cache: exactly the blocks before the first row it
computes. Bounded in bytes, least recently used out first.
"""

import dataclasses
import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from serve_app.engine.wire import EngineRequest, EngineResult, PositionLogprobs, concatenated


@dataclass(frozen=True)
class Rows:
    """Rows of consecutive positions, each the prompt token then the top-k: [positions, k + 1]."""

    token_ids: np.ndarray  # int32
    logprobs: np.ndarray  # float32
    ranks: np.ndarray  # int64

    @property
    def nbytes(self) -> int:
        return self.token_ids.nbytes + self.logprobs.nbytes + self.ranks.nbytes

    @classmethod
    def of(cls, positions: PositionLogprobs, first: int, last: int, width: int) -> "Rows":
        """Positions first..last - 1 of engine rows that each hold at least `width` entries."""
        starts = positions.offsets[first:last]
        index = starts[:, None] + np.arange(width)
        return cls(positions.token_ids[index], positions.logprobs[index], positions.ranks[index])

    @classmethod
    def joined(cls, parts: list["Rows"]) -> "Rows":
        return concatenated(parts)

    @property
    def count(self) -> int:
        return self.token_ids.shape[0]

    def part(self, first: int, last: int) -> "Rows":
        return Rows(self.token_ids[first:last], self.logprobs[first:last], self.ranks[first:last])

    def narrowed(self, width: int) -> "Rows":
        return Rows(self.token_ids[:, :width], self.logprobs[:, :width], self.ranks[:, :width])

    def as_positions(self) -> PositionLogprobs:
        """As a prompt's PositionLogprobs: position 0 (no row) first, then these rows."""
        count, width = self.token_ids.shape
        offsets = np.concatenate([[0], np.arange(count + 1, dtype=np.int64) * width])
        return PositionLogprobs(offsets, self.token_ids.ravel(), self.logprobs.ravel(), self.ranks.ravel())


@dataclass(frozen=True)
class Entry:
    tokens: np.ndarray  # the block's tokens that its rows score: positions bB + 1 .. (b + 1)B
    rows: Rows

    @property
    def nbytes(self) -> int:
        return self.tokens.nbytes + self.rows.nbytes


def entry_keys(namespace: str, token_ids: list[int], block: int) -> list[bytes]:
    """Key b stands for the namespace and tokens 0 .. (b + 1)B: the rows of block b depend
    on all of them."""
    keys, digest = [], hashlib.blake2b(namespace.encode(), digest_size=16).digest()
    tokens = np.asarray(token_ids, np.int32)
    digest = hashlib.blake2b(digest + tokens[:1].tobytes(), digest_size=16).digest()
    for end in range(block + 1, len(tokens) + 1, block):
        digest = hashlib.blake2b(digest + tokens[end - block:end].tobytes(), digest_size=16).digest()
        keys.append(digest)
    return keys


@dataclass(frozen=True)
class Plan:
    """A request's use of the cache: the rows known for its first positions (from 1), and the
    engine request that computes the rest."""

    request: EngineRequest
    engine_request: EngineRequest
    keys: list[bytes]
    known: Rows | None


class ScoredPrefixCache:
    def __init__(self, block: int, top_k: int, max_bytes: int):
        self.block = block
        self.top_k = top_k
        self.max_bytes = max_bytes
        self.entries: OrderedDict[bytes, Entry] = OrderedDict()
        self.bytes = 0

    def eligible(self, request: EngineRequest) -> bool:
        """Every prompt row shown (echo, prompt_logprobs), with a top-k this cache keeps: not
        labels, not the full vocabulary, not a span (which reads the KV cache up to it)."""
        k = request.prompt_logprobs
        return (k is not None and 0 <= k <= self.top_k and not request.logprob_token_ids
                and request.prompt_rows_from < 2)

    def plan(self, request: EngineRequest, namespace: str) -> Plan:
        """The known rows of the request's longest scored prefix; the engine request asks the
        cache's top-k from the first unknown row on, reading the KV cache up to it."""
        tokens = request.prompt_token_ids
        keys = entry_keys(namespace, tokens, self.block)
        found = []
        for index, key in enumerate(keys):
            entry = self.entries.get(key)
            first = index * self.block + 1
            if entry is None or not np.array_equal(entry.tokens, tokens[first:first + self.block]):
                break
            self.entries.move_to_end(key)
            found.append(entry.rows)
        engine_request = dataclasses.replace(request, prompt_logprobs=self.top_k,
                                             prompt_rows_from=len(found) * self.block + 1)
        return Plan(request, engine_request, keys, Rows.joined(found) if found else None)

    def complete(self, plan: Plan, result: EngineResult) -> EngineResult:
        """The request's result with every prompt row, the known ones first (the engine read at
        most their tokens from its KV cache, so it computed every row after them), narrowed to
        the request's top-k; the new whole blocks stored."""
        known = plan.known.count if plan.known is not None else 0
        computed = Rows.of(result.prompt_logprobs, known + 1, len(plan.request.prompt_token_ids),
                           self.top_k + 1)
        rows = Rows.joined([plan.known, computed]) if plan.known is not None else computed
        self.store(plan, rows)
        width = plan.request.prompt_logprobs + 1
        return dataclasses.replace(result, prompt_logprobs=rows.narrowed(width).as_positions())

    def store(self, plan: Plan, rows: Rows) -> None:
        """Each whole block of rows not stored yet (rows[i] is position i + 1's)."""
        tokens = np.asarray(plan.request.prompt_token_ids, np.int32)
        for index, key in enumerate(plan.keys):
            if key not in self.entries:
                first = index * self.block
                block = rows.part(first, first + self.block)
                self.add(key, Entry(tokens[first + 1:first + 1 + self.block], block))

    def add(self, key: bytes, entry: Entry) -> None:
        if entry.nbytes > self.max_bytes:
            return
        self.entries[key] = entry
        self.bytes += entry.nbytes
        while self.bytes > self.max_bytes:
            _, evicted = self.entries.popitem(last=False)
            self.bytes -= evicted.nbytes
