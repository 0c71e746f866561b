"""probserve's changes to vLLM 0.32 (pinned).

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
   per-entry objects), the [positions, vocab] tensors are kept as arrays, stored away in
   chunks of positions; vLLM's LogprobsProcessor would decode and box every entry (millions).
"""

from collections.abc import Callable

import numpy as np

from serve_app.scoring import FullVocabParts, FullVocabRows

PROMPT_LABELS = "probserve_prompt_label_ids"
FULL_VOCAB = "probserve_full_vocab_in_token_order"


def register() -> None:
    """The plugin's entry point: vLLM calls it in every process; applying twice is a no-op."""
    gather_marked_prompt_rows()


def patched(owner, name: str, replacement) -> None:
    """Sets owner.name to replacement unless it is already ours."""
    if not getattr(getattr(owner, name), "probserve", False):
        getattr(replacement, "__func__", replacement).probserve = True  # a staticmethod's function
        setattr(owner, name, replacement)


def keep_full_vocab_as_arrays(store: Callable[[FullVocabRows], object], chunk_positions: int) -> None:
    """Full-vocabulary rows become FullVocabParts: `store` keeps each chunk of positions."""
    from vllm.v1.engine.logprobs import LogprobsProcessor

    per_entry = LogprobsProcessor._update_prompt_logprobs

    def update_prompt_logprobs(self, tensors) -> None:
        if self.num_prompt_logprobs != -1:
            return per_entry(self, tensors)
        token_ids, logprobs, ranks, *_ = tensors  # the prompt tokens; their rows by token id
        logprobs, token_ids = logprobs.numpy(), token_ids.numpy()[:, 0]
        actual = logprobs[np.arange(len(token_ids)), token_ids]
        rows = FullVocabRows(logprobs, actual, ranks.numpy().astype(np.int64))
        parts = FullVocabParts.split(rows, self.num_logprobs or 0, chunk_positions, store)
        if isinstance(self.prompt_logprobs, FullVocabParts):  # a later prefill step
            parts = self.prompt_logprobs.followed_by(parts)
        self.prompt_logprobs = parts

    patched(LogprobsProcessor, "_update_prompt_logprobs", update_prompt_logprobs)


class LabelCount(int):
    """A labelled request's prompt top-k count, carrying its labels to the gather: the V1
    runner hands the gather nothing else that says which request a row belongs to."""

    def __new__(cls, label_ids: list[int]) -> "LabelCount":
        count = super().__new__(cls, len(label_ids))
        count.label_ids = label_ids
        return count


class FullVocabCount(int):
    """A full-vocabulary request's prompt top-k count (the vocabulary), marked for the gather
    and for the runner's buffer, which it sizes with `count + 1`."""

    def __add__(self, other: int) -> "FullVocabCount":
        return FullVocabCount(int(self) + other)


def gather_marked_prompt_rows() -> None:
    """Labelled and full-vocabulary prompt rows, gathered as marked (items 1 and 2)."""
    import torch
    from vllm.utils.torch_utils import PIN_MEMORY
    from vllm.v1.outputs import LogprobsTensors
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    update_states, gather_top_k = GPUModelRunner._update_states, Sampler.gather_logprobs
    empty_cpu = LogprobsTensors.empty_cpu

    def marked_count(count: int, extra_args: dict) -> int:
        if extra_args.get(PROMPT_LABELS):
            return LabelCount(extra_args[PROMPT_LABELS])
        return FullVocabCount(count) if extra_args.get(FULL_VOCAB) else count

    def update_states_marking_counts(self, scheduler_output):
        result = update_states(self, scheduler_output)
        for new in scheduler_output.scheduled_new_reqs:
            extra_args = (new.sampling_params and new.sampling_params.extra_args) or {}
            if new.req_id in self.num_prompt_logprobs:
                count = self.num_prompt_logprobs[new.req_id]
                self.num_prompt_logprobs[new.req_id] = marked_count(count, extra_args)
        return result

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
            return empty_cpu(positions, columns)
        ids = empty_cpu(positions, 1)
        values = ids.logprobs.new_empty((positions, int(columns) - 1), pin_memory=PIN_MEMORY)
        return LogprobsTensors(ids.logprob_token_ids, values, ids.selected_token_ranks)

    patched(GPUModelRunner, "_update_states", update_states_marking_counts)
    patched(Sampler, "gather_logprobs", staticmethod(gather_marked))
    patched(LogprobsTensors, "empty_cpu", staticmethod(empty_cpu_for))
