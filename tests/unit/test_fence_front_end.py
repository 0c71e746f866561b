"""The front end's prompt rows kept as arrays, against vLLM's own per-entry path."""

import numpy as np
import pytest
import torch

from serve_app.engine.vllm_fence.front_end import keep_prompt_logprobs_as_arrays
from serve_app.engine.vllm_fence.touch_points import original
from serve_app.engine.vllm_fence.worker import LabelCount


@pytest.mark.parametrize("count", [1, 5, LabelCount([7, 3])])
def test_prompt_rows_kept_as_arrays_list_what_vllms_own_path_lists(count):
    """Two prefill steps of a prompt's rows (the prompt token, then the top k or the labels),
    through vLLM's per-entry path and through the fence's arrays: the same entries and ranks."""
    from vllm.v1.engine.logprobs import LogprobsProcessor
    from vllm.v1.outputs import LogprobsTensors

    from serve_app.engine.vllm_adapter import prompt_positions
    from serve_app.engine.wire import PromptRows

    rng = np.random.default_rng(0)

    def step(rows: int) -> LogprobsTensors:
        width = int(count) + 1
        return LogprobsTensors(torch.tensor(rng.integers(0, 50, (rows, width)), dtype=torch.int32),
                               torch.tensor(-rng.random((rows, width)), dtype=torch.float32),
                               torch.tensor(rng.integers(1, 50, rows)))

    def processor() -> LogprobsProcessor:
        from vllm.logprobs import create_prompt_logprobs
        return LogprobsProcessor(tokenizer=None, logprobs=None, prompt_logprobs=create_prompt_logprobs(True),
                                 cumulative_logprob=None, num_logprobs=None, num_prompt_logprobs=count)

    steps = [step(3), step(2)]
    vllms, ours = processor(), processor()
    for tensors in steps:
        original("LogprobsProcessor._update_prompt_logprobs")(vllms, tensors)
    keep_prompt_logprobs_as_arrays(chunk_positions=4)
    for tensors in steps:
        ours._update_prompt_logprobs(tensors)
    assert isinstance(ours.prompt_logprobs, PromptRows)
    expected, found = prompt_positions(vllms.prompt_logprobs), prompt_positions(ours.prompt_logprobs)
    for name in ("offsets", "token_ids", "logprobs", "ranks"):
        assert np.array_equal(getattr(found, name), getattr(expected, name)), name
        assert getattr(found, name).dtype == getattr(expected, name).dtype, name
