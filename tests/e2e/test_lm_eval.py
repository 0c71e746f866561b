"""lm-evaluation-harness as researchers run it against vLLM's server: its `local-completions`
model scores a multiple-choice task with the server's own tokenizer (`tokenizer_backend=remote`:
GET /tokenizer_info, POST /tokenize and /detokenize, no model named), and its loglikelihoods
equal those of its Hugging Face backend and the float32 reference.

The remote tokenizer names no model, so the caller is a tenant with one (the tenancy
application's `evaluator`)."""

import random

import pytest

from bench.lm_eval_task import write_task
from serve_app.store.model_store import TINY, embedded_model_path
from tests.e2e.reference import TOLERANCE
from tests.e2e.tenancy_app import as_

TASK = "probserve_choices"
QUESTIONS = 6
WORDS = ["river", "stone", "light", "cloud", "paper", "garden", "window", "silver", "winter", "bridge"]


def questions() -> list[dict]:
    rng = random.Random(7)
    return [{"context": f"Question {i}: " + " ".join(rng.choices(WORDS, k=12)),
             "choices": [" ".join(rng.choices(WORDS, k=rng.randint(1, 3))) for _ in range(3)],
             "answer": rng.randrange(3)} for i in range(QUESTIONS)]


def loglikelihoods(url: str, key: str, folder, backend: dict) -> list[float]:
    """Each choice's loglikelihood as the harness scored it, in the task's order."""
    from lm_eval import simple_evaluate
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    model = LocalCompletionsAPI(base_url=f"{url}/v1/completions", model=TINY, tokenized_requests=True,
                                auth_token=key, header={"Authorization": f"Bearer {key}"},
                                max_length=512, max_retries=1, **backend)
    results = simple_evaluate(model=model, tasks=[TASK], log_samples=True,
                              task_manager=TaskManager(include_path=str(folder), include_defaults=False))
    samples = sorted(results["samples"][TASK], key=lambda sample: sample["doc_id"])
    return [response[0] for sample in samples for response in sample["filtered_resps"]]


def reference_loglikelihoods(reference, docs: list[dict]) -> list[float]:
    """As the harness splits a request: the context's tokens, then the rest of the whole's."""
    values = []
    for doc in docs:
        context = doc["context"] + "\nAnswer:"
        for choice in doc["choices"]:
            whole = reference.tokenizer.encode(f"{context} {choice}", add_special_tokens=False)
            start = len(reference.tokenizer.encode(context, add_special_tokens=False))
            rows = reference.prompt_rows(whole)
            values.append(float(sum(rows[p][whole[p]] for p in range(start, len(whole)))))
    return values


def test_the_remote_tokenizer_scores_as_the_local_one(tenancy_url, keys, reference, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    docs = questions()
    write_task(tmp_path, TASK, docs)
    key = as_(keys, "evaluator")["authorization"].removeprefix("Bearer ")
    remote = loglikelihoods(tenancy_url, key, tmp_path, {"tokenizer_backend": "remote"})
    local = loglikelihoods(tenancy_url, key, tmp_path, {"tokenizer_backend": "huggingface",
                                                       "tokenizer": str(embedded_model_path(TINY))})
    expected = reference_loglikelihoods(reference, docs)
    assert len(remote) == len(local) == len(expected) == QUESTIONS * 3
    assert remote == pytest.approx(local, abs=TOLERANCE)
    assert remote == pytest.approx(expected, abs=TOLERANCE * 10)  # a sum of up to 4 logprobs
