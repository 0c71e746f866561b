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
2. The full vocabulary (prompt_logprobs -1), in the replica's own process only (it would break
   vLLM's server, which expects its per-entry objects): keep the engine core's sorted
   [positions, vocab] tensors as arrays, stored away in chunks of positions as each prefill
   step delivers them; vLLM's LogprobsProcessor would decode and box every entry (millions).
"""

from collections.abc import Callable

import numpy as np

from serve_app.scoring import FullVocabParts, FullVocabRows

PROMPT_LABELS = "probserve_prompt_label_ids"


def register() -> None:
    """The plugin's entry point: vLLM calls it in every process; applying twice is a no-op."""
    gather_prompt_labels()


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
        token_ids, logprobs, ranks, *_ = tensors  # column 0: the prompt token; then by rank
        rows = FullVocabRows(token_ids[:, 1:].numpy().astype(np.int32), logprobs[:, 1:].numpy(),
                             logprobs[:, 0].numpy(), ranks.numpy().astype(np.int64))
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


def gather_prompt_labels() -> None:
    import torch
    from vllm.v1.outputs import LogprobsTensors
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    update_states, gather_top_k = GPUModelRunner._update_states, Sampler.gather_logprobs

    def update_states_with_labels(self, scheduler_output):
        result = update_states(self, scheduler_output)
        for new in scheduler_output.scheduled_new_reqs:
            labels = ((new.sampling_params and new.sampling_params.extra_args) or {}).get(PROMPT_LABELS)
            if labels and new.req_id in self.num_prompt_logprobs:
                self.num_prompt_logprobs[new.req_id] = LabelCount(labels)
        return result

    def gather_labels_or_top_k(logprobs, num_logprobs, token_ids):
        if not isinstance(num_logprobs, LabelCount):
            return gather_top_k(logprobs, num_logprobs, token_ids)
        actual = gather_top_k(logprobs, 0, token_ids)  # the prompt token and its true rank
        labels = torch.tensor(num_logprobs.label_ids, device=logprobs.device).expand(len(token_ids), -1)
        return LogprobsTensors(
            torch.cat([actual.logprob_token_ids, labels.to(torch.int32)], dim=1),
            torch.cat([actual.logprobs, logprobs.gather(-1, labels)], dim=1),
            actual.selected_token_ranks)

    patched(GPUModelRunner, "_update_states", update_states_with_labels)
    patched(Sampler, "gather_logprobs", staticmethod(gather_labels_or_top_k))
