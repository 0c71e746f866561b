"""What the ingress asks of a model replica and what comes back: plain data, compact arrays.

A replica returns log-probabilities as flat numpy arrays, never per-entry Python objects:
position p owns entries `offsets[p]:offsets[p + 1]`; the first entry is the token actually
there (prompt or sampled) with its true rank, followed by the top-k in rank order.
"""

from dataclasses import dataclass, field

import numpy as np


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
    logprobs: int | None = None  # top-k of each generated token
    prompt_logprobs: int | None = None  # top-k of each prompt token


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
        """The k most likely tokens at `position`: ids, logprobs, ranks (1..k)."""
        first = self.offsets[position] + 1
        last = min(first + k, self.offsets[position + 1])
        return self.token_ids[first:last], self.logprobs[first:last], self.ranks[first:last]


@dataclass(frozen=True)
class Completion:
    token_ids: np.ndarray
    text: str
    finish_reason: str | None
    logprobs: PositionLogprobs | None


@dataclass(frozen=True)
class EngineResult:
    prompt_token_ids: np.ndarray
    prompt_logprobs: PositionLogprobs | None
    completions: list[Completion]
