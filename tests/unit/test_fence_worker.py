"""The worker's patches on tensors: labels and the full vocabulary gathered at prompt
positions, a window's rows from its first on, labels beside a top-k at generated positions, a
later pipeline stage's input buffer; the plugin's entry point that installs them."""

from importlib.metadata import entry_points

import torch

from serve_app.engine.vllm_fence import register
from serve_app.engine.vllm_fence.touch_points import FULL_VOCAB
from serve_app.engine.vllm_fence.worker import FullVocabCount, LabelCount, marked_count, rows_from


def test_vllms_plugin_entry_point_is_register():
    (plugin,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "probserve"]
    assert plugin.load() is register


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


def test_labels_and_a_top_k_in_one_step_each_reach_their_own_request():
    register()
    from vllm.v1.sample.sampler import Sampler

    sampler = Sampler()
    logprobs = torch.log_softmax(torch.tensor([[3.0, 1.0, 2.0, 0.0], [0.0, 1.0, 2.0, 3.0],
                                               [1.0, 3.0, 0.0, 2.0]]), dim=-1)
    sampled = torch.tensor([0, 3, 1])
    sampler.probserve_top_k = 2  # the step's widest top-k, as forward notes it
    gathered = sampler.gather_specific_token_logprobs(logprobs, {1: [2, 0, 1]}, sampled)
    # Row 1 asked for labels: its sampled token, then them; rows 0 and 2 their top 2 (padded).
    assert gathered.logprob_token_ids.tolist() == [[0, 0, 2, 0], [3, 2, 0, 1], [1, 1, 3, 0]]
    assert torch.equal(gathered.logprobs[1], logprobs[1, [3, 2, 0, 1]])
    assert torch.equal(gathered.logprobs[0, :3], logprobs[0, [0, 0, 2]])
    assert gathered.logprobs[0, 3] == float("-inf")
    sampler.probserve_top_k = None  # a step of labels alone: vLLM's own gather
    alone = sampler.gather_specific_token_logprobs(logprobs, {1: [2, 0, 1]}, sampled)
    assert alone.logprob_token_ids[1].tolist() == [3, 2, 0, 1] and alone.logprobs[0, 1] == float("-inf")


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
    count = FullVocabCount(4, 0)
    gathered = Sampler.gather_logprobs(logprobs, count, torch.tensor([2, 0]))
    assert gathered.logprob_token_ids.tolist() == [[2], [0]]
    assert gathered.logprobs is logprobs  # no copy
    assert gathered.selected_token_ranks.tolist() == [2, 4]
    # the runner sizes its buffer with `count + 1` and copies the gathered rows into it
    buffer = LogprobsTensors.empty_cpu(2, count + 1)
    assert buffer.logprob_token_ids.shape == (2, 1) and buffer.logprobs.shape == (2, 4)
    buffer.logprob_token_ids.copy_(gathered.logprob_token_ids)
    buffer.logprobs.copy_(gathered.logprobs)
    plain = LogprobsTensors.empty_cpu(2, 3)  # other requests' buffers are vLLM's, zeroed
    assert plain.logprob_token_ids.shape == (2, 3)
    for tensor in (plain.logprob_token_ids, plain.logprobs, plain.selected_token_ranks):
        assert not tensor.any()


def test_a_windows_rows_leave_the_worker_from_its_first_row_on_copied():
    from vllm.v1.outputs import LogprobsTensors

    count = marked_count(4, {FULL_VOCAB: 2})
    assert isinstance(count + 1, FullVocabCount) and (count + 1).first_row == 2  # the buffer's size
    buffer = LogprobsTensors.empty_cpu(5, count + 1)
    written = torch.arange(12.0).reshape(3, 4)
    buffer.logprobs[2:] = written
    rows = rows_from(buffer, count.first_row)
    assert isinstance(rows, LogprobsTensors) and rows.logprobs.tolist() == written.tolist()
    assert rows.logprobs.untyped_storage().nbytes() == 3 * 4 * 4  # not a view of the buffer
    assert rows.logprob_token_ids.shape == (3, 1) and rows.selected_token_ranks.shape == (3,)


class LaterStage:
    """What GPUModelRunner's stage-input gather reads of a runner of a later pipeline stage
    that no dummy run warmed (item 10)."""

    max_num_tokens, device = 8, "cpu"
    model_config = type("ModelConfig", (), {"dtype": torch.float32})

    def __init__(self):
        self.intermediate_tensors, self.made = None, 0
        self.model = self

    def make_empty_intermediate_tensors(self, batch_size, dtype, device):
        from vllm.sequence import IntermediateTensors

        self.made += 1
        rows = torch.zeros((batch_size, 4), dtype=dtype, device=device)
        return IntermediateTensors({"hidden_states": rows})


def test_a_later_stage_makes_its_input_buffer_on_first_use_and_keeps_it():
    register()
    from vllm.sequence import IntermediateTensors
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    runner = LaterStage()
    received = IntermediateTensors({"hidden_states": torch.arange(12.0).reshape(3, 4)})
    inputs = GPUModelRunner.sync_and_gather_intermediate_tensors(runner, 3, received, True)
    assert torch.equal(inputs["hidden_states"], received["hidden_states"])
    buffer = runner.intermediate_tensors
    assert runner.made == 1 and buffer["hidden_states"].shape == (LaterStage.max_num_tokens, 4)
    again = GPUModelRunner.sync_and_gather_intermediate_tensors(runner, 2, None, False)
    assert runner.made == 1 and runner.intermediate_tensors is buffer
    assert torch.equal(again["hidden_states"], received["hidden_states"][:2])


def lora_step() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three tokens of one step: one of no adapter (slot -1), then one each of the engine's two
    adapter slots, both filled; a rank-2 LoRA's stacked A [slots, 1, rank, in] and B."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randn(3, 4, generator=generator)
    stacked_a = torch.randn(2, 1, 2, 4, generator=generator)
    stacked_b = torch.randn(2, 1, 5, 2, generator=generator)
    return tokens, torch.tensor([-1, 0, 1]), stacked_a, stacked_b


def test_a_token_of_no_adapter_takes_no_adapters_weights_in_prefill_and_decode():
    register()
    from vllm.lora.ops.torch_ops import sgmv_expand
    from vllm.lora.ops.torch_ops.lora_ops import sgmv_shrink
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    tokens, slots, stacked_a, stacked_b = lora_step()
    base = torch.randn(3, 5)
    prefill = torch.full((3, 2), 7.0)  # the shrink's buffer, as vLLM leaves it between layers
    sgmv_shrink(tokens, stacked_a, prefill, torch.tensor([0, 1, 2]), torch.ones(3, dtype=torch.long), slots,
                3, 1, 3, 0.5)
    decode = torch.full((3, 2), 7.0)
    PunicaWrapperCPU._shrink_decode(type("Punica", (), {"token_lora_indices": slots})(), decode, tokens,
                                    stacked_a, 0.5)
    for buffer in (prefill, decode):
        assert torch.equal(buffer[0], torch.zeros(2))  # the base token's: nothing of slot 1's
        for row in (1, 2):
            assert torch.allclose(buffer[row], 0.5 * stacked_a[slots[row], 0] @ tokens[row])
        out = base.clone()
        sgmv_expand(buffer, stacked_b, out, torch.tensor([0, 1, 2]), torch.ones(3, dtype=torch.long), slots,
                    3, 1, 3, add_inputs=True)
        assert torch.equal(out[0], base[0])  # bit for bit the base model's
        assert not torch.equal(out[1], base[1]) and not torch.equal(out[2], base[2])


def test_one_row_through_onednn_has_the_bits_of_the_same_row_in_a_batch():
    """SmolLM2's down-projection (1,536 long): on an AVX-512 CPU oneDNN's one-row kernel sums
    otherwise than its batch kernel."""
    register()
    from vllm import _custom_ops as ops

    torch.manual_seed(0)
    handler = ops.create_onednn_mm(torch.randn(576, 1536).t(), 32)
    rows = torch.randn(40, 1536)
    batch = ops.onednn_mm(handler, rows, None)
    for count in (1, 2, 17, 40):
        assert torch.equal(ops.onednn_mm(handler, rows[:count].contiguous(), None), batch[:count]), count
    alone = ops.onednn_mm(handler, rows[0], None)  # a row without its batch dimension
    assert alone.shape == (576,) and torch.equal(alone, batch[0])
