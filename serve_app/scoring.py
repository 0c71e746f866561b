"""What the ingress asks of a model replica and what comes back: plain data, compact arrays.

A replica returns log-probabilities as flat numpy arrays, never per-entry Python objects:
position p owns entries `offsets[p]:offsets[p + 1]`; the first entry is the token actually
there (prompt or sampled) with its true rank, followed by the top-k in rank order, or by the
labels a request named (`logprob_token_ids`) in its order.
"""

from collections.abc import Callable
from dataclasses import dataclass, field, fields

import numpy as np

NEG_INF_LOGPROB = -9999.0  # JSON has no -Infinity; vLLM's convention


def token_array(token_ids) -> np.ndarray:
    return np.asarray(token_ids, np.int32)


@dataclass(frozen=True)
class EngineRequest:
    prompt_token_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    n: int = 1
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    logprobs: int | None = None  # top-k of each generated token
    prompt_logprobs: int | None = None  # top-k of each prompt token; -1: the full vocabulary
    # Labels: these ids' logprobs in place of the top-k, wherever logprobs are asked.
    logprob_token_ids: list[int] | None = None


@dataclass(frozen=True)
class PositionLogprobs:
    offsets: np.ndarray  # int64 [positions + 1]
    token_ids: np.ndarray  # int32 [entries]
    logprobs: np.ndarray  # float32 [entries]
    ranks: np.ndarray  # int64 [entries]

    @classmethod
    def from_flat(cls, start_indices, end_indices, token_ids, logprobs, ranks) -> "PositionLogprobs":
        """From vLLM's FlatLogprobs lists (contiguous positions)."""
        offsets = np.asarray([*start_indices, end_indices[-1] if end_indices else 0], np.int64)
        return cls(
            offsets=offsets,
            token_ids=token_array(token_ids),
            logprobs=np.asarray(logprobs, np.float32),
            ranks=np.asarray(ranks, np.int64),
        )

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def is_scored(self, position: int) -> bool:
        return self.offsets[position + 1] > self.offsets[position]

    def actual(self, position: int) -> tuple[int, float, int]:
        """The token at `position`: its id, logprob and rank."""
        entry = self.offsets[position]
        return int(self.token_ids[entry]), float(self.logprobs[entry]), int(self.ranks[entry])

    def top(self, position: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The k entries after the actual token: the top-k (ranks 1..k) or the labels."""
        first = self.offsets[position] + 1
        last = min(first + k, self.offsets[position + 1])
        return self.token_ids[first:last], self.logprobs[first:last], self.ranks[first:last]


@dataclass(frozen=True)
class FullVocabRows:
    """Row r is the distribution that predicted prompt token r + 1, sorted by logprob:
    `token_ids[r, j]` is the token of rank j + 1. The prompt token's own logprob and rank
    come with the rows (as vLLM computes them), so no row is searched for it."""

    token_ids: np.ndarray  # int32 [prompt tokens - 1, vocab]
    logprobs: np.ndarray  # float32 [prompt tokens - 1, vocab]
    actual_logprobs: np.ndarray  # float32 [prompt tokens - 1]
    actual_ranks: np.ndarray  # int64 [prompt tokens - 1]

    def followed_by(self, later: "FullVocabRows") -> "FullVocabRows":
        return FullVocabRows(*(np.concatenate([getattr(self, f.name), getattr(later, f.name)])
                               for f in fields(self)))

    def positions(self, start: int, stop: int) -> "FullVocabRows":
        return FullVocabRows(*(getattr(self, f.name)[start:stop] for f in fields(self)))

    def first_columns(self, k: int) -> "FullVocabRows":
        """The top k of each row, with the prompt tokens' own logprobs and ranks."""
        return FullVocabRows(self.token_ids[:, :k].copy(), self.logprobs[:, :k].copy(),
                             self.actual_logprobs, self.actual_ranks)

    def top_k_positions(self, prompt_token_ids: list[int], k: int) -> PositionLogprobs:
        """The top-k view of these rows, as the top-k path returns it (position 0 unscored)."""
        rows, width = len(self.token_ids), k + 1
        token_ids = np.empty((rows, width), np.int32)
        logprobs = np.empty((rows, width), np.float32)
        ranks = np.empty((rows, width), np.int64)
        token_ids[:, 0] = prompt_token_ids[1:]
        logprobs[:, 0], ranks[:, 0] = self.actual_logprobs, self.actual_ranks
        token_ids[:, 1:], logprobs[:, 1:] = self.token_ids[:, :k], self.logprobs[:, :k]
        ranks[:, 1:] = np.arange(1, k + 1)
        offsets = np.concatenate([[0, 0], np.arange(1, rows + 1) * width]).astype(np.int64)
        return PositionLogprobs(offsets, token_ids.ravel(), logprobs.ravel(), ranks.ravel())


@dataclass(frozen=True)
class FullVocabParts:
    """prompt_logprobs -1 as a replica returns it: the rows in chunks of a few positions, each
    stored apart (`store` puts it in Ray's object store: the matrix never travels as one
    object, and the serializer pool fetches each chunk where it writes it), and the first k
    columns of every row, for the top-k view of the same positions (echo)."""

    chunks: list  # what `store` returned for each chunk, in position order
    sizes: list[int]  # the positions in each
    top_k: FullVocabRows

    @classmethod
    def split(cls, rows: FullVocabRows, k: int, chunk_positions: int,
              store: Callable[[FullVocabRows], object]) -> "FullVocabParts":
        starts = range(0, len(rows.token_ids), chunk_positions)
        chunks = [rows.positions(start, start + chunk_positions) for start in starts]
        return cls([store(chunk) for chunk in chunks], [len(chunk.token_ids) for chunk in chunks],
                   rows.first_columns(k))

    def followed_by(self, later: "FullVocabParts") -> "FullVocabParts":
        return FullVocabParts(self.chunks + later.chunks, self.sizes + later.sizes,
                              self.top_k.followed_by(later.top_k))


@dataclass(frozen=True)
class Completion:
    index: int  # which of the request's n samples
    token_ids: np.ndarray
    text: str
    finish_reason: str | None
    logprobs: PositionLogprobs | None


@dataclass(frozen=True)
class EngineResult:
    prompt_token_ids: np.ndarray
    prompt_logprobs: PositionLogprobs | None
    completions: list[Completion]
    # With prompt_logprobs -1: every token's logprob at every prompt position.
    full_vocab: FullVocabParts | None = None

    def prompt_positions(self, k: int) -> PositionLogprobs:
        """The prompt's top-k entries, from whichever form the engine returned."""
        if self.full_vocab is not None:
            return self.full_vocab.top_k.top_k_positions(self.prompt_token_ids.tolist(), k)
        return self.prompt_logprobs

