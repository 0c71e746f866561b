"""In vLLM's worker processes (every rank of a split model: each computes the same logits,
gathered to all tensor ranks, on the last pipeline stage), the model runner's (GPUModelRunner,
V1) and its Sampler's: labels gathered at prompt positions (item 1), the full vocabulary in
token-id order from a window's first row on (item 2), labels beside other requests' top k at
generated positions (item 4), a later pipeline stage's inputs where no dummy run made their
buffer (item 10), and no adapter's weights for tokens of none on the CPU (item 11); items of
serve_app.engine.vllm_fence.touch_points. register() installs them.

How a row's request reaches the gather: the V1 runner hands `Sampler.gather_logprobs` only the
logprobs, a count and the target ids, and sizes its buffer from the same count. So the count
itself is marked (LabelCount, FullVocabCount: `int` subclasses) where the runner stores it;
every place in vLLM that carries the count from there is named in the table's
MARKED_COUNT_USES, which a test compares with vLLM's source: an `int()`, `max()` or new use
there would drop a mark.
"""

from serve_app.engine.vllm_fence.touch_points import FULL_VOCAB, PROMPT_LABELS, original, patched


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



def marked_count(count: int, extra_args: dict) -> int:
    if extra_args.get(PROMPT_LABELS):
        return LabelCount(extra_args[PROMPT_LABELS])
    return FullVocabCount(count, extra_args[FULL_VOCAB]) if FULL_VOCAB in extra_args else count


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


def make_stage_inputs_when_first_needed() -> None:
    """A later pipeline stage's buffer for its inputs, made on its first use (item 10)."""
    gather = original("GPUModelRunner.sync_and_gather_intermediate_tensors")

    def gather_into_a_made_buffer(self, num_tokens, intermediate_tensors, sync_self):
        if self.intermediate_tensors is None:
            self.intermediate_tensors = self.model.make_empty_intermediate_tensors(
                batch_size=self.max_num_tokens, dtype=self.model_config.dtype, device=self.device)
        return gather(self, num_tokens, intermediate_tensors, sync_self)

    patched("GPUModelRunner.sync_and_gather_intermediate_tensors", gather_into_a_made_buffer)


def no_adapter_for_tokens_of_none() -> None:
    """Tokens without a LoRA adapter (slot -1) take no adapter's weights in vLLM's PyTorch
    LoRA ops, which read slot -1 as the last slot (item 11)."""
    shrink = original("bgmv_shrink")

    def shrink_adapters_only(inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling=1.0):
        shrink(inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling)
        output_tensor[lora_indices_tensor < 0] = 0

    def shrink_decode(self, y, x, w_t_all, scale):
        shrink_adapters_only(x, w_t_all, y, self.token_lora_indices, scale)

    patched("bgmv_shrink", shrink_adapters_only)
    patched("PunicaWrapperCPU._shrink_decode", shrink_decode)


def seeded_cpu_samples_skip_discarded_steps() -> None:
    """A request's seeded CPU generator sits out a step whose sample for it is discarded (its
    prompt still being computed), instead of being wound back by an offset it has not
    (item 13)."""
    import numpy as np

    sample_tokens = original("GPUModelRunner.sample_tokens")

    def sample_tokens_setting_cpu_seeds_aside(self, grammar_output):
        generators = self.input_batch.generators
        discarded = np.nonzero(self.discard_request_mask.np[:self.input_batch.num_reqs])[0]
        aside = {index: generators.pop(index) for index in map(int, discarded)
                 if index in generators and generators[index].device.type == "cpu"}
        try:
            return sample_tokens(self, grammar_output)
        finally:
            generators.update(aside)

    patched("GPUModelRunner.sample_tokens", sample_tokens_setting_cpu_seeds_aside)


def one_row_matmuls_as_two() -> None:
    """A oneDNN matmul of one row computed as two (the row twice), the first kept: oneDNN takes
    another kernel for one row, whose sums differ in the last bits from the same row's in a
    batch (item 14)."""
    onednn_mm = original("onednn_mm")

    def onednn_mm_of_two_rows_at_least(dnnl_handler, x, bias):
        if x.numel() != dnnl_handler.k:
            return onednn_mm(dnnl_handler, x, bias)
        twice = x.reshape(1, dnnl_handler.k).expand(2, -1).contiguous()
        return onednn_mm(dnnl_handler, twice, bias)[:1].reshape(*x.shape[:-1], dnnl_handler.n)

    patched("onednn_mm", onednn_mm_of_two_rows_at_least)
