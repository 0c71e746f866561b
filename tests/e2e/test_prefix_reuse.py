"""Scored spans read the prefix cache: the choices of one context, each scored from its own
start (as an evaluation suite sends them), read the context from vLLM's prefix cache after the
first, never past the position that scores the span's first token (the replicas' exported
count of tokens read says how many), and answer what the same span answers computed without
the cache and what the reference computes; on every tokenizer family, with a top-k and with
labels."""

import random
import re
import time

import httpx
import numpy as np
import pytest

from tests.e2e.conftest import FAMILIES, SMALL_QUEUE_MODEL
from tests.e2e.reference import TOLERANCE

BLOCK = 128  # vLLM's KV cache block on the CPU: hits are whole blocks
CHOICES = 4
# Each request scores its span with a top-k or with labels; echoed whole (every row needed),
# the same prompt is computed without reading the cache.
SCORES = {"top-k": {"logprobs": 5}, "labels": {"logprob_token_ids": [10, 11, 12]}}
SETTLE_S = 30


def cache_reads(metrics_url: str, model: str) -> float:
    """The model's prefix-cache reads as its replicas export them (Ray's metrics agent)."""
    text = httpx.get(metrics_url, timeout=30).text
    labels = rf'{{[^}}]*model="{re.escape(model)}"[^}}]*}}'
    pattern = rf"^ray_probserve_prefix_cache_read_tokens_total{labels} (\S+)$"
    return sum(float(value) for value in re.findall(pattern, text, re.MULTILINE))


def reads_after(metrics_url: str, model: str, before: float, expected: int) -> float:
    """The reads since `before`, once they reach `expected` (Ray reports every 2 s)."""
    deadline = time.monotonic() + SETTLE_S
    while (grown := cache_reads(metrics_url, model) - before) < expected and time.monotonic() < deadline:
        time.sleep(1)
    return grown


@pytest.fixture(scope="module")
def metrics_url(base_url, metrics_port):
    return f"http://127.0.0.1:{metrics_port}/metrics"


def context_and_choices(reference, seed: str) -> tuple[list[int], list[list[int]]]:
    """A context of two blocks of random ids (no other request shares its prefix) and four
    short continuations. Each choice's prompt fills a third block in part: the cache holds
    both blocks of the context, but a span from the context's end may read only the first
    (position 255 scores the span's first token)."""
    rng = random.Random(seed)
    size = len(reference.tokenizer)
    pick = lambda count: [rng.randrange(10, min(size, 250)) for _ in range(count)]  # noqa: E731
    return pick(2 * BLOCK), [pick(rng.randrange(1, 4)) for _ in range(CHOICES)]


FIELDS = ("tokens", "token_ids", "token_logprobs", "top_logprobs")


def span(complete, model: str, ids: list[int], start: int, **fields) -> dict:
    """The prompt's logprobs from `start` on, scored as a span (the generated token left out)."""
    logprobs = complete(model=model, prompt=ids, max_tokens=1, temperature=0, logprob_start_len=start,
                        **fields)["choices"][0]["logprobs"]
    return {field: logprobs[field][:len(ids) - start] for field in FIELDS}


def echoed_from(complete, model: str, ids: list[int], start: int, **fields) -> dict:
    """The prompt's logprobs from `start` on, echoed whole: computed without the cache."""
    logprobs = complete(model=model, prompt=ids, max_tokens=1, temperature=0, echo=True,
                        **fields)["choices"][0]["logprobs"]
    return {field: logprobs[field][start:len(ids)] for field in FIELDS}


def assert_same_span(cached: dict, uncached: dict) -> None:
    for field in ("tokens", "token_ids"):
        assert cached[field] == uncached[field]
    np.testing.assert_allclose(cached["token_logprobs"], uncached["token_logprobs"], atol=TOLERANCE)
    for at, expected in zip(cached["top_logprobs"], uncached["top_logprobs"], strict=True):
        assert at.keys() == expected.keys()
        np.testing.assert_allclose(list(at.values()), list(expected.values()), atol=TOLERANCE)


@pytest.mark.parametrize("scores", SCORES)
@pytest.mark.parametrize("family", FAMILIES)
def test_choices_of_one_context_read_it_from_the_cache_and_score_exactly(
        complete, references, metrics_url, family, scores):
    reference, fields = references[family], SCORES[scores]
    context, choices = context_and_choices(reference, seed=f"{family}/{scores}")
    start = len(context)
    hit = (start - 1) // BLOCK * BLOCK  # the cut: positions before start - 1, in whole blocks
    for index, choice in enumerate(choices):
        ids = context + choice
        before = cache_reads(metrics_url, family)
        cached = span(complete, family, ids, start, **fields)
        assert reads_after(metrics_url, family, before, hit if index else 0) == (hit if index else 0)
        assert cached["token_ids"] == choice
        rows = reference.prompt_rows(ids)
        np.testing.assert_allclose(cached["token_logprobs"],
                                   [rows[p][ids[p]] for p in range(start, len(ids))], atol=TOLERANCE)
        assert_same_span(cached, echoed_from(complete, family, ids, start, **fields))


@pytest.mark.parametrize("family", [family for family in FAMILIES if family != SMALL_QUEUE_MODEL])
def test_choices_sent_together_compute_their_context_once(complete, references, metrics_url, family):
    """One batch of the four choices: the ingress sends its prompts to the engine at once, and
    the three that find the first computing their context wait for it, then read it. (Not on
    the model whose queue the overload tests keep at two in flight and two waiting.)"""
    reference = references[family]
    context, choices = context_and_choices(reference, seed=f"{family}/together")
    start = len(context)
    before = cache_reads(metrics_url, family)
    answer = complete(model=family, prompt=[context + choice for choice in choices], max_tokens=1,
                      temperature=0, logprob_start_len=start, logprobs=1)
    hits = (CHOICES - 1) * ((start - 1) // BLOCK * BLOCK)
    assert reads_after(metrics_url, family, before, hits) == hits
    for choice, answered in zip(choices, sorted(answer["choices"], key=lambda c: c["index"]), strict=True):
        ids = context + choice
        rows = reference.prompt_rows(ids)
        assert answered["logprobs"]["token_ids"][:len(choice)] == choice
        np.testing.assert_allclose(answered["logprobs"]["token_logprobs"][:len(choice)],
                                   [rows[p][ids[p]] for p in range(start, len(ids))], atol=TOLERANCE)
