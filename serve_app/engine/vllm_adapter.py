"""probserve's side of vLLM's engine API: the engine's arguments from a model's config, an
EngineRequest as vLLM's SamplingParams, and vLLM's outputs as EngineResults with compact
arrays (serve_app.engine.wire) in place of vLLM's per-entry lists. What the engine's private
parts are made to do is the fence's (serve_app.engine.vllm_fence)."""

import os
import sys
from pathlib import Path

from serve_app.batch_invariance import SWITCH, Device, refusal
from serve_app.config import ModelConfig
from serve_app.engine.vllm_fence.replica_start import ask_for_the_v1_runner
from serve_app.engine.vllm_fence.touch_points import FULL_VOCAB, PREFIX_CACHE_LIMIT, PROMPT_LABELS
from serve_app.engine.wire import (
    Adapter,
    Completion,
    EngineRequest,
    EngineResult,
    FullVocabParts,
    PositionLogprobs,
    PromptRows,
    token_array,
)
from serve_app.observe.metrics import EngineRequestStats
from serve_app.observe.request_log import separate_logger
from serve_app.parallel import CPU_BINDING, RAY, UNIPROCESS, cpu_binding, uses_gpus
from serve_app.store.home import apply_cache_environment


def prepare_process(model: ModelConfig) -> None:
    """Environment vLLM reads at start: caches in PROBSERVE_HOME, CPU cores, logging, the
    model runner the patches are on."""
    apply_cache_environment()
    ask_for_the_v1_runner()
    # By default vLLM keeps a core for itself; on small hosts inference needs them all.
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    # On CUDA, vLLM samples top-k/top-p with FlashInfer, whose kernels compile at first use with
    # the host's CUDA toolkit (none in the GPU image). Scoring seldom samples, and log-probabilities
    # are taken before sampling: torch's sampler does it with nothing to compile.
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    bind_cpu_workers(model)
    compute_in_the_engine_core(model)
    log_vllm_beside_serve()
    batch_invariance(model)


def batch_invariance(model: ModelConfig) -> None:
    """vLLM's batch-invariant mode, switched on before vLLM loads (some of its kernels read the
    switch at import), on a device that has its kernels; else the replica refuses to start,
    naming why."""
    if not model.batch_invariant:
        return
    os.environ[SWITCH] = "1"
    problem = refusal(replica_device())
    if problem:
        raise ValueError(f"model {model.name!r}: batch_invariant: {problem}")


def replica_device() -> Device:
    """The replica's device as vLLM sees it: on CUDA through NVML, which leaves CUDA to the
    engine's processes."""
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return Device(current_platform.device_name, current_platform.get_device_name())
    capability = current_platform.get_device_capability()
    return Device("cuda", current_platform.get_device_name(),
                  None if capability is None else (capability.major, capability.minor))


def compute_in_the_engine_core(model: ModelConfig) -> None:
    """`uni`: vLLM's CPU platform swaps it for its multiprocess executor unless told that the
    engine itself may skip processes (its front end keeps the engine-core process)."""
    if model.executor_backend() == UNIPROCESS:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


def bind_cpu_workers(model: ModelConfig) -> None:
    """Each CPU worker of a split model its own cores, unless the environment says which
    (serve_app.parallel.cpu_binding)."""
    workers = model.parallelism().workers
    if uses_gpus(model.ray_actor_options) or CPU_BINDING in os.environ:
        return
    numa_nodes = len(list(Path("/sys/devices/system/node").glob("node[0-9]*")))
    binding = cpu_binding(sorted(os.sched_getaffinity(0)), numa_nodes, workers)
    if binding is not None:
        os.environ[CPU_BINDING] = binding


def log_vllm_beside_serve() -> None:
    """vLLM's loggers to stdout, without vLLM's own setup: at import it applies a
    `logging.config.dictConfig`, which closes every handler of the process, Ray Serve's replica
    log among them. That log's lines were lost, and a restarted Serve controller, which reads
    the handler to recover a replica, stopped every model replica instead."""
    os.environ["VLLM_CONFIGURE_LOGGING"] = "0"
    separate_logger("vllm", sys.stdout, "%(levelname)s %(asctime)s [%(name)s] %(message)s")


def engine_args(model: ModelConfig):
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.platforms import current_platform

    # vLLM sizes CPU memory from the NUMA node, not the machine: set the KV cache explicitly
    # (VLLM_CPU_KVCACHE_SPACE in the environment, whole GiB, still overrides it).
    cpu_kv_cache = round(model.cpu_kv_cache_gib * 2**30) if current_platform.is_cpu() else None
    lora = model.lora

    return AsyncEngineArgs(
        model=str(model.resolved_path()),
        served_model_name=model.name,
        dtype=model.dtype,
        max_model_len=model.capabilities.max_model_len,
        max_logprobs=-1,  # the ingress enforces the caps; -1 lets any top-k through
        tensor_parallel_size=model.tensor_parallel_size,
        pipeline_parallel_size=model.pipeline_parallel_size,
        distributed_executor_backend=model.executor_backend(),
        max_num_batched_tokens=model.max_num_batched_tokens,
        enforce_eager=model.enforce_eager,
        gpu_memory_utilization=model.gpu_memory_utilization,
        kv_cache_memory_bytes=cpu_kv_cache,
        block_size=model.kv_block_size,
        enable_lora=lora is not None,
        **({"max_lora_rank": lora.max_lora_rank, "max_loras": lora.max_loras,
            "max_cpu_loras": lora.max_cpu_loras, "lora_target_modules": lora.target_modules} if lora else {}),
        disable_log_stats=False,  # vLLM's per-request statistics and engine metrics
        scheduling_policy="priority",  # online requests before batch work (EngineRequest.priority)
        # On by default on CUDA: the next step is scheduled before the last one's outputs are
        # back. The fence's worker patches are read and tested with one step after another
        # (the CPU's way), so off until a GPU run proves them with it.
        async_scheduling=False,
    )


def engine_config(model: ModelConfig):
    """vLLM's engine config; a replica whose workers are Ray actors hands vLLM its placement
    group, which vLLM's engine process (not a Ray worker) cannot look up itself."""
    config = engine_args(model).create_engine_config()
    if model.executor_backend() == RAY:
        from ray.util import get_current_placement_group

        config.parallel_config.placement_group = get_current_placement_group()
    return config


def lora_request(adapter: Adapter, adapter_id: int):
    """vLLM's request for an adapter; `adapter_id` is its number in this engine, never reused
    for another. vLLM's prefix cache keys blocks by the adapter's name and folder."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(adapter.name, adapter_id, adapter.path)


def label_params(request: EngineRequest) -> dict:
    """Labels in place of the top-k: vLLM's own field at generated positions, probserve's
    plugin (serve_app.engine.vllm_fence) at prompt positions; the full vocabulary in token-id
    order, from the request's first row."""
    labels = request.logprob_token_ids
    if not labels:
        full_vocab = request.prompt_logprobs == -1
        return {"logprobs": request.logprobs, "prompt_logprobs": request.prompt_logprobs,
                "extra_args": {FULL_VOCAB: request.first_prompt_row()} if full_vocab else {}}
    prompt = request.prompt_logprobs is not None
    return {
        "logprobs": None,  # vLLM: the labels' count stands for it
        "logprob_token_ids": labels if request.logprobs is not None else None,
        "prompt_logprobs": len(labels) if prompt else None,
        "extra_args": {PROMPT_LABELS: labels} if prompt else {},
    }


def prefix_cache_params(request: EngineRequest) -> dict:
    """vLLM reads no prefix cache for a request with prompt logprobs; one that shows rows from
    position s on may read its first s - 1 tokens from it (the fence cuts the hit there)."""
    readable = request.cache_readable_tokens()
    if request.prompt_logprobs is None or readable == 0:
        return {}
    return {"skip_reading_prefix_cache": False, "extra_args": {PREFIX_CACHE_LIMIT: readable}}


def logprob_params(request: EngineRequest) -> dict:
    labels, cache = label_params(request), prefix_cache_params(request)
    extra_args = {**labels.pop("extra_args"), **cache.pop("extra_args", {})}
    return {**labels, **cache, "extra_args": extra_args or None}


def sampling_params(request: EngineRequest, stream: bool = False):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        n=request.n,
        max_tokens=request.max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        seed=request.seed,
        stop=request.stop or None,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        logit_bias=request.logit_bias,
        **logprob_params(request),
        flat_logprobs=True,
        output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
    )


def prompt_positions(prompt) -> PositionLogprobs | None:
    """A prompt's rows: arrays as the fence keeps them, or vLLM's own (a prompt it scored no
    row of)."""
    return prompt.as_positions() if isinstance(prompt, PromptRows) else compact(prompt)


def compact(flat) -> PositionLogprobs | None:
    if flat is None:
        return None
    return PositionLogprobs.from_flat(flat.start_indices, flat.end_indices, flat.token_ids,
                                      flat.logprobs, flat.ranks)


def queue_time(stats, sent_at: float | None) -> float | None:
    """To reach the replica (wall clocks: the ingress's and this process's), then in the
    engine's queue (the engine's own clock)."""
    if stats is None or not stats.scheduled_ts or sent_at is None:
        return None
    return max(0.0, stats.arrival_time - sent_at) + max(0.0, stats.scheduled_ts - stats.queued_ts)


def engine_stats(final, generated_tokens: int) -> EngineRequestStats:
    stats = final.metrics
    prefilled = stats is not None and stats.first_token_ts and stats.scheduled_ts
    return EngineRequestStats(
        prompt_tokens=len(final.prompt_token_ids), cached_tokens=final.num_cached_tokens or 0,
        generated_tokens=generated_tokens,
        prefill_time_s=stats.first_token_ts - stats.scheduled_ts if prefilled else None)


def engine_result(output, sent_at: float | None) -> EngineResult:
    completions = [
        Completion(index=c.index, token_ids=token_array(c.token_ids), text=c.text,
                   finish_reason=c.finish_reason, logprobs=compact(c.logprobs))
        for c in sorted(output.outputs, key=lambda c: c.index)
    ]
    prompt = output.prompt_logprobs
    full_vocab = prompt if isinstance(prompt, FullVocabParts) else None
    return EngineResult(prompt_token_ids=token_array(output.prompt_token_ids),
                        prompt_logprobs=None if full_vocab else prompt_positions(prompt),
                        completions=completions, full_vocab=full_vocab,
                        queue_time_s=queue_time(output.metrics, sent_at))
