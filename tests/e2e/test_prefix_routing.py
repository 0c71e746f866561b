"""A model of two replicas (the session's sibling model: tests/e2e/conftest.py): the choices
of each question, sent as lm-evaluation-harness sends them (echo, a question's four choices
in one request, four questions at once), reach the replica that computed their context, so
each context is computed once, as the engines' exported counters show (prefill tokens: the
prompt tokens less those read from a prefix cache); and the questions spread over both."""

from concurrent.futures import ThreadPoolExecutor

import httpx

from serve_app.store.model_store import TINY, TINY_SIBLING
from tests.e2e.test_prefix_reuse import (
    context_and_choices,
    exported,
    exported_series,
    growth,
    settled_series,
    whole_blocks,
)
from tests.e2e.waiting import read_until

QUESTIONS, AT_ONCE = 8, 4
PROMPT, PREFILL = "probserve_prompt_tokens_total", "probserve_prefill_tokens_total"


def harness_request(http: httpx.Client, context: list[int], choices: list[list[int]]) -> None:
    body = {"model": TINY_SIBLING, "prompt": [context + choice for choice in choices], "echo": True,
            "max_tokens": 1, "logprobs": 1, "temperature": 0}
    answer = http.post("/v1/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    echoed = [choice["logprobs"]["token_ids"][:len(context) + len(sent)]
              for choice, sent in zip(answer.json()["choices"], choices, strict=True)]
    assert echoed == [context + choice for choice in choices]


def test_each_questions_context_is_computed_once_on_one_of_two_replicas(http, references, metrics_url):
    questions = [context_and_choices(references[TINY], TINY, seed=f"routing/{index}")
                 for index in range(QUESTIONS)]
    prompt_tokens = sum(len(context) + len(choice) for context, choices in questions for choice in choices)
    prompt_before = settled_series(metrics_url, PROMPT, TINY_SIBLING)
    prefill_before = exported(metrics_url, PREFILL, TINY_SIBLING)
    with ThreadPoolExecutor(AT_ONCE) as pool:
        list(pool.map(lambda question: harness_request(http, *question), questions))
    prompt_after = read_until(lambda: exported_series(metrics_url, PROMPT, TINY_SIBLING),
                              lambda after: growth(prompt_before, after) >= prompt_tokens, 30,
                              "the prompt tokens")
    assert growth(prompt_before, prompt_after) == prompt_tokens
    # Every choice after a question's first reads the context's whole blocks before the row
    # that scores the choice's first token (the sibling's blocks are its family's).
    read = sum((len(choices) - 1) * whole_blocks(TINY, len(context) - 1) for context, choices in questions)
    computed = prompt_tokens - read
    assert read_until(lambda: exported(metrics_url, PREFILL, TINY_SIBLING) - prefill_before,
                      lambda prefilled: prefilled >= computed, 10, "the prefill tokens") == computed
    grown = [after - prompt_before.get(series, 0.0) for series, after in prompt_after.items()]
    assert len([tokens for tokens in grown if tokens > 0]) == 2, prompt_after  # both replicas served
