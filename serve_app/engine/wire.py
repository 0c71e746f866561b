"""What the ingress asks of a model replica and what comes back: plain data, compact arrays.

A replica returns log-probabilities as flat numpy arrays, never per-entry Python objects:
position p owns entries `offsets[p]:offsets[p + 1]`; the first entry is the token actually
there (prompt or sampled) with its true rank, followed by the top-k in rank order, or by the
labels a request named (`logprob_token_ids`) in its order.
"""

import hashlib
from dataclasses import dataclass, field, fields, replace

import numpy as np

from serve_app.config import Served


def token_array(token_ids) -> np.ndarray:
    return np.asarray(token_ids, np.int32)


ONLINE = 0  # EngineRequest.priority of the API's own callers
# The tenant and priority of a replica's own requests (its warm-up and self-checks).
REPLICA_ITSELF = {"tenant": "probserve:replica", "priority": ONLINE}

# Generated tokens a request scoring its prompt may ask for and still be waited for.
SCORING_MAX_TOKENS = 16
# The namespace of every request's prefix caches on a model that shares them
# (`models[].shared_prefix_caches`); a tenant's own is "tenant:" and its name.
SHARED_CACHES = "shared"


class EngineUnavailable(Exception):
    """Raised by a model replica whose vLLM engine has stopped (its process died): the
    request gets 503 `not_ready` while Ray Serve replaces the replica."""


class AdapterUnavailable(Exception):
    """Raised by a model replica whose engine could not load a request's LoRA adapter (its
    folder missing on the replica's node, or unreadable): 400 `adapter_not_found`."""


class Late(Exception):
    """Raised by a model replica for a request it would not answer within its model's
    `max_answer_s` (serve_app.engine.time_admission): 503 `overloaded`, with Retry-After."""

    def __init__(self, message: str, retry_after_s: float):
        super().__init__(message, retry_after_s)  # both in args: Ray pickles it by them

    @property
    def retry_after_s(self) -> float:
        return self.args[1]

    def __str__(self) -> str:
        return self.args[0]


class QueueTimeout(Exception):
    """Raised by a model replica for a request that waited for a place longer than its model's
    `max_queue_wait_s`: the request gets 503 `overloaded`."""


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter a request is computed with: its served name, its folder, and the load
    it is of (an adapter loaded at run time: serve_app.tenants.adapter_registry)."""

    name: str
    path: str
    revision: str = ""

    @classmethod
    def of(cls, served: Served) -> "Adapter | None":
        adapter = served.adapter
        return adapter and cls(adapter.name, str(adapter.resolved_path()), served.revision)

    @property
    def key(self) -> str:
        """What tells this adapter from any other a replica may hold, which Serve routes by
        (and shows in its own metrics: the folder only hashed)."""
        return f"{self.name}#{self.revision}#{hashlib.sha256(self.path.encode()).hexdigest()[:12]}"


def routed(replica, request: "EngineRequest"):
    """A model's deployment handle for the request: Serve's router, told its adapter's key,
    sends it preferably to a replica that holds the adapter (serve_app.engine.engine_adapters)."""
    return replica.options(multiplexed_model_id=request.adapter.key) if request.adapter else replica


@dataclass(frozen=True)
class Caller:
    """Whose engine requests admission builds, and on what: the tenant (ANONYMOUS without a
    key file), the scheduling priority (ONLINE, or a batch's), the adapter (none: the base)."""

    tenant: str
    priority: int
    adapter: Adapter | None = None


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
    # The first prompt position whose row the answer shows (a scored span's start): the
    # engine may read the positions before the one that scores it from its prefix cache.
    prompt_rows_from: int = 0
    # False: the prompt computed whole, its prefix cache unread (a replica's fallback).
    read_prefix_cache: bool = True
    # Labels: these ids' logprobs in place of the top-k, wherever logprobs are asked.
    logprob_token_ids: list[int] | None = None
    # When the ingress sent it (wall clock, time.time()): the replica measures the wait from it.
    sent_at: float | None = None
    # Whose request it is, set where it is built (serve_app.api.admission), never defaulted: a
    # tenant's prefix caches are its own unless its model shares them (engine.replica).
    tenant: str = field(kw_only=True)
    # vLLM's scheduling priority, lower first: ONLINE for the API's callers, higher for batch
    # lines and dataset documents (BatchConfig.priority), which take what online work leaves.
    priority: int = field(kw_only=True)
    # The LoRA adapter the model computes it with; none: the base model.
    adapter: Adapter | None = field(default=None, kw_only=True)

    def background(self) -> bool:
        return self.priority > ONLINE

    def scores(self) -> bool:
        """A scoring request: prompt rows, and so few tokens to generate that it ends soon
        after its prefill (requests that share its prefix may wait for it)."""
        return self.prompt_logprobs is not None and self.max_tokens <= SCORING_MAX_TOKENS

    def cache_readable_tokens(self) -> int:
        """How many leading prompt tokens the engine may read from its prefix cache: vLLM's
        own limit without prompt rows; with them, the tokens before the one whose logits
        score the first row shown (none when every row is shown)."""
        if self.prompt_logprobs is None:
            return len(self.prompt_token_ids) - 1
        return self.first_prompt_row() if self.read_prefix_cache else 0

    def cache_namespace(self, shared: bool) -> str:
        """Whose prefix caches the request reads and fills (vLLM's KV cache salted with it, the
        scored-prefix cache keyed by it, the models' router's prefix index): its tenant's,
        unless the model shares them (`shared`), and its adapter's: the same tokens under
        another adapter have other rows."""
        owner = SHARED_CACHES if shared else f"tenant:{self.tenant}"
        return f"{owner}|adapter:{self.adapter.key}" if self.adapter else owner

    def first_prompt_row(self) -> int:
        """The index of the first prompt row shown (row r scores position r + 1)."""
        return max(self.prompt_rows_from - 1, 0)


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

    @classmethod
    def spliced(cls, parts: list["PositionLogprobs"], starts: list[int]) -> "PositionLogprobs":
        """One prompt's positions from the windows that computed them: part k's from position
        starts[k] to its end (a window's prompt ends where the next one's rows start)."""
        pairs = list(zip(parts, starts))
        counts = np.concatenate([np.diff(part.offsets[start:]) for part, start in pairs])
        entries = {name: np.concatenate([getattr(part, name)[part.offsets[start]:] for part, start in pairs])
                   for name in ("token_ids", "logprobs", "ranks")}
        return cls(offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), **entries)

    def top(self, position: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The k entries after the actual token: the top-k (ranks 1..k) or the labels."""
        first = self.offsets[position] + 1
        last = min(first + k, self.offsets[position + 1])
        return self.token_ids[first:last], self.logprobs[first:last], self.ranks[first:last]


def concatenated(parts: list):
    """Dataclasses of arrays joined field by field, in order (rows of consecutive positions)."""
    return type(parts[0])(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(parts[0])))


@dataclass(frozen=True)
class PromptRows:
    """Prompt rows as the engine computes them, kept as arrays in the replica's process (vLLM's
    LogprobsProcessor would decode and box every entry, about 5 us each: a 1,000-token prompt
    at top-5 took 30 ms of the replica's CPU): column 0 the prompt token, then its top k (or
    its labels); row r scores prompt token r + 1."""

    token_ids: np.ndarray  # int32 [positions, columns]
    logprobs: np.ndarray  # float32 [positions, columns]
    ranks: np.ndarray  # int64 [positions]: the prompt token's

    def followed_by(self, later: "PromptRows") -> "PromptRows":
        return concatenated([self, later])

    def as_positions(self) -> PositionLogprobs:
        """As vLLM's own path lists them: position 0 unscored, then each row's entries, ranked
        as vLLM ranks them (the prompt token's rank, then 1 to k)."""
        rows, width = self.token_ids.shape
        ranks = np.empty((rows, width), np.int64)
        ranks[:, 0], ranks[:, 1:] = self.ranks, np.arange(1, width)
        offsets = np.concatenate([[0], np.arange(rows + 1, dtype=np.int64) * width])
        return PositionLogprobs(offsets, self.token_ids.ravel().astype(np.int32, copy=False),
                                self.logprobs.ravel().astype(np.float32, copy=False), ranks.ravel())


@dataclass(frozen=True)
class RankedRows:
    """The first columns of full-vocabulary rows by rank: `token_ids[r, j]` is the token of rank
    j + 1 in row r; with the prompt tokens' own logprobs and ranks."""

    token_ids: np.ndarray  # int32 [positions, columns]
    logprobs: np.ndarray  # float32 [positions, columns]
    actual_token_ids: np.ndarray  # int32 [positions]
    actual_logprobs: np.ndarray  # float32 [positions]
    actual_ranks: np.ndarray  # int64 [positions]

    def followed_by(self, later: "RankedRows") -> "RankedRows":
        return concatenated([self, later])

    def top_k_positions(self, prompt_token_ids: list[int], k: int) -> PositionLogprobs:
        """The top-k view of these rows, as the top-k path returns it (position 0 unscored)."""
        token_ids = np.column_stack([prompt_token_ids[1:], self.token_ids[:, :k]]).astype(np.int32)
        logprobs = np.column_stack([self.actual_logprobs, self.logprobs[:, :k]]).astype(np.float32)
        return PromptRows(token_ids, logprobs, self.actual_ranks).as_positions()


@dataclass(frozen=True)
class FullVocabRows:
    """Row r is the distribution that predicted prompt token r + 1, in token-id order, as the
    engine computes it (no sort there: the `.npy` form wants this order, and the JSON writer
    sorts a chunk where it writes it). The prompt token's own logprob and rank come with the
    rows (as vLLM computes them), so no row is searched for it."""

    logprobs: np.ndarray  # float32 [prompt tokens - 1, vocab]
    actual_token_ids: np.ndarray  # int32 [prompt tokens - 1]: prompt tokens 1 on
    actual_logprobs: np.ndarray  # float32 [prompt tokens - 1]
    actual_ranks: np.ndarray  # int64 [prompt tokens - 1]

    def positions(self, start: int, stop: int) -> "FullVocabRows":
        return FullVocabRows(*(getattr(self, f.name)[start:stop] for f in fields(self)))

    def ranked(self, k: int | None = None) -> RankedRows:
        """The top k of each row (all of it when None), by descending logprob; ties in any
        order, as the engine's own top-k leaves them."""
        if k == 0:
            order = np.empty((len(self.logprobs), 0), np.intp)
        elif k is None or k >= self.logprobs.shape[1]:
            order = np.argsort(-self.logprobs, axis=1)
        else:
            negated = -self.logprobs
            top = np.argpartition(negated, k, axis=1)[:, :k]
            order = np.take_along_axis(top, np.argsort(np.take_along_axis(negated, top, 1), 1), 1)
        return RankedRows(order.astype(np.int32), np.take_along_axis(self.logprobs, order, axis=1),
                          self.actual_token_ids, self.actual_logprobs, self.actual_ranks)


@dataclass(frozen=True)
class FullVocabParts:
    """prompt_logprobs -1: the rows in chunks of a few positions (FullVocabRows in the
    replica; in the ingress, each chunk's reference in Ray's object store: the matrix never
    travels as one object, and the serializer pool fetches each chunk where it writes it),
    and the top k of every row, for the top-k view of the same positions (echo)."""

    chunks: list  # in position order
    sizes: list[int]  # the positions in each
    top_k: RankedRows

    @classmethod
    def split(cls, rows: FullVocabRows, k: int, chunk_positions: int) -> "FullVocabParts":
        starts = range(0, len(rows.logprobs), chunk_positions)
        chunks = [rows.positions(start, start + chunk_positions) for start in starts]
        return cls(chunks, [len(chunk.logprobs) for chunk in chunks], rows.ranked(k))

    def with_chunks(self, chunks: list) -> "FullVocabParts":
        return replace(self, chunks=chunks)

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
    # From the ingress sending the request to the engine scheduling it; None before that.
    queue_time_s: float | None = None

    def prompt_positions(self, k: int) -> PositionLogprobs:
        """The prompt's top-k entries, from whichever form the engine returned."""
        if self.full_vocab is not None:
            return self.full_vocab.top_k.top_k_positions(self.prompt_token_ids.tolist(), k)
        return self.prompt_logprobs


    def after(self, earlier: list["EngineResult"]) -> "EngineResult":
        """The last window of a full-vocabulary prompt (serve_app.engine.windows) joined with
        the windows before it: their rows first, the queue time of the first."""
        if not earlier:
            return self
        parts = earlier[0].full_vocab
        for window in earlier[1:] + [self]:
            parts = parts.followed_by(window.full_vocab)
        return replace(self, full_vocab=parts, queue_time_s=earlier[0].queue_time_s)
