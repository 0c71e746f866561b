"""In the replica's process, around its engine's start: the V1 model runner asked for before
it, and an engine config that says V2 refused (item 8 of
serve_app.engine.vllm_fence.touch_points); once it runs, each patched path checked against
vLLM's own (the self-check)."""

import os
from collections.abc import Awaitable, Callable

import numpy as np

from serve_app.engine.vllm_fence.touch_points import RUNNER_SWITCH
from serve_app.engine.wire import REPLICA_ITSELF, EngineRequest, EngineResult, FullVocabRows, PositionLogprobs


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
                           "probserve's vLLM patches do not fit this vLLM (serve_app.engine.vllm_fence)")


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
