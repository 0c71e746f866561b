"""In vLLM's front end, AsyncLLM in the replica's own process (never vLLM's own server, which
expects per-entry objects): prompt rows kept as arrays (items 2 and 5 of
serve_app.engine.vllm_fence.touch_points), and the engine's gauges held (item 7). The replica
installs them as it starts its engine."""

import numpy as np

from serve_app.engine.vllm_fence.touch_points import patched
from serve_app.engine.wire import FullVocabParts, FullVocabRows, PromptRows
from serve_app.observe.metrics import HELD_GAUGES


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


def full_vocab_rows(logprobs: np.ndarray, token_ids: np.ndarray, ranks: np.ndarray) -> FullVocabRows:
    """Rows in token-id order, with each prompt token's own logprob and rank."""
    actual = logprobs[np.arange(len(token_ids)), token_ids]
    return FullVocabRows(logprobs, token_ids.astype(np.int32), actual, ranks.astype(np.int64))


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
