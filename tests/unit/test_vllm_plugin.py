"""The vLLM plugin's gather, on tensors: labels in place of the top-k, the prompt token's rank
as vLLM computes it."""

import torch

from serve_app.vllm_plugin import FullVocabCount, LabelCount, register


def test_labels_replace_the_top_k_and_keep_the_true_rank():
    register()
    from vllm.v1.sample.sampler import Sampler

    logprobs = torch.log_softmax(torch.tensor([[3.0, 1.0, 2.0, 0.0], [0.0, 1.0, 2.0, 3.0]]), dim=-1)
    targets = torch.tensor([2, 0])
    gathered = Sampler.gather_logprobs(logprobs, LabelCount([3, 1]), targets)
    assert gathered.logprob_token_ids.tolist() == [[2, 3, 1], [0, 3, 1]]
    expected = torch.stack([logprobs[0, [2, 3, 1]], logprobs[1, [0, 3, 1]]])
    assert torch.equal(gathered.logprobs, expected)
    assert gathered.selected_token_ranks.tolist() == [2, 4]
    top_k = Sampler.gather_logprobs(logprobs, 2, targets)  # unchanged for plain counts
    assert top_k.logprob_token_ids.tolist() == [[2, 0, 2], [0, 3, 2]]


def test_registering_twice_patches_once():
    register()
    from vllm.v1.sample.sampler import Sampler

    first = Sampler.gather_logprobs
    register()
    assert Sampler.gather_logprobs is first


def test_the_full_vocabulary_comes_as_it_is_with_only_the_prompt_tokens_ids():
    register()
    from vllm.v1.outputs import LogprobsTensors
    from vllm.v1.sample.sampler import Sampler

    logprobs = torch.log_softmax(torch.tensor([[3.0, 1.0, 2.0, 0.0], [0.0, 1.0, 2.0, 3.0]]), dim=-1)
    count = FullVocabCount(4)
    gathered = Sampler.gather_logprobs(logprobs, count, torch.tensor([2, 0]))
    assert gathered.logprob_token_ids.tolist() == [[2], [0]]
    assert gathered.logprobs is logprobs  # no copy
    assert gathered.selected_token_ranks.tolist() == [2, 4]
    # the runner sizes its buffer with `count + 1` and copies the gathered rows into it
    buffer = LogprobsTensors.empty_cpu(2, count + 1)
    assert buffer.logprob_token_ids.shape == (2, 1) and buffer.logprobs.shape == (2, 4)
    buffer.logprob_token_ids.copy_(gathered.logprob_token_ids)
    buffer.logprobs.copy_(gathered.logprobs)
    plain = LogprobsTensors.empty_cpu(2, 3)  # other requests' buffers are vLLM's
    assert plain.logprob_token_ids.shape == (2, 3)
