"""Scored spans read the prefix cache: the choices of one context, each scored from its own
start (as an evaluation suite sends them), read the context from vLLM's prefix cache after the
first, never past the position that scores the span's first token (the replica's count of
tokens read says how many: tests/e2e/inspected_replica.py), and answer what the same span
answers computed without the cache and what the reference computes; on every tokenizer
family, with a top-k and with labels."""

import random
import re
import time
from collections import Counter

import httpx
import numpy as np
import pytest
from ray import serve

from serve_app.config import ScoredCacheConfig, model_deployment_name
from serve_app.ops.local_ray import APP_NAME
from tests.e2e.conftest import FAMILIES, KV_BLOCKS, SMALL_CACHE_BYTES, SMALL_CACHE_MODEL, SMALL_QUEUE_MODEL
from tests.e2e.reference import TOLERANCE
from tests.e2e.waiting import REPORT_S, read_until, settled_reading

CHOICES = 4
# Each request scores its span with a top-k or with labels; echoed whole (every row needed),
# the same prompt is computed without reading the cache.
SCORES = {"top-k": {"logprobs": 5}, "labels": {"logprob_token_ids": [10, 11, 12]}}


SCORED_BYTES = "probserve_scored_cache_bytes"


def exported_series(metrics_url: str, metric: str, model: str,
                    application: str = "probserve") -> dict[str, float]:
    """A counter of the application's replicas of the model as Ray's metrics agent exports it
    (`source="cache"` where the counter has sources), by each series' labels: one a process."""
    text = httpx.get(metrics_url, timeout=30).text
    series = re.findall(rf"^ray_{metric}{{([^}}]*)}} (\S+)$", text, re.MULTILINE)
    wanted = (f'model="{model}"', f'application="{application}"')
    return {labels: float(value) for labels, value in series if all(label in labels for label in wanted)
            and ("source=" not in labels or 'source="cache"' in labels)}


def exported(metrics_url: str, metric: str, model: str, application: str = "probserve") -> float:
    """The counter summed over the application's replicas of the model."""
    return sum(exported_series(metrics_url, metric, model, application).values())


def settled_series(metrics_url: str, metric: str, model: str) -> dict[str, float]:
    """The counter by series (exported_series) once one more of Ray's reports brought nothing new."""
    return settled_reading(lambda: exported_series(metrics_url, metric, model))


def growth(before: dict[str, float], after: dict[str, float]) -> float:
    """How much a counter's series grew: a process's series gone since (a replica replaced)
    is left out, a new one counts from 0."""
    return sum(value - before.get(series, 0.0) for series, value in after.items())


def counted(model: str, application: str = APP_NAME) -> dict[str, int]:
    """The model's replica's totals of cache reads (InspectedReplica.counted)."""
    handle = serve.get_deployment_handle(model_deployment_name(model), app_name=application)
    return Counter(handle.counted.remote().result())


def cache_reads(model: str) -> int:
    """Tokens the model's engine has read from its prefix cache."""
    return counted(model)["cache_read"]


def read_since(model: str, before: int, expected: int) -> int:
    """Tokens read since `before`, once `expected` were (a stream's last engine request counts
    its reads as its generator ends, a moment after the body's last byte); the test fails if
    fewer were within 10 s."""
    return read_until(lambda: cache_reads(model) - before, lambda read: read >= expected, 10,
                      "the cache reads", pause_s=0.05)


def context_and_choices(reference, family: str, seed: str,
                        extra: int = 0) -> tuple[list[int], list[list[int]]]:
    """A context of two of the family's KV blocks of random ids (no other request shares its
    prefix), and `extra` more, and four short continuations. Each choice's prompt fills a third
    block in part: the cache holds both blocks of the context, but a span from the context's
    end may read only the first (the position before the span's scores its first token)."""
    rng = random.Random(seed)
    size = len(reference.tokenizer)
    pick = lambda count: [rng.randrange(10, min(size, 250)) for _ in range(count)]  # noqa: E731
    return pick(2 * KV_BLOCKS[family] + extra), [pick(rng.randrange(1, 4)) for _ in range(CHOICES)]


def whole_blocks(family: str, tokens: int) -> int:
    """The tokens of whole KV blocks among the first `tokens`: what a cache hit can hold."""
    return tokens // KV_BLOCKS[family] * KV_BLOCKS[family]


FIELDS = ("tokens", "token_ids", "token_logprobs", "top_logprobs")
CACHED_TOP_K = ScoredCacheConfig().top_k


def span(complete, model: str, ids: list[int], start: int, **fields) -> dict:
    """The prompt's logprobs from `start` on, scored as a span (the generated token left out)."""
    logprobs = complete(model=model, prompt=ids, max_tokens=1, temperature=0, logprob_start_len=start,
                        **fields)["choices"][0]["logprobs"]
    return {field: logprobs[field][:len(ids) - start] for field in FIELDS}


def echoed_from(complete, model: str, ids: list[int], start: int, **fields) -> dict:
    """The prompt's logprobs from `start` on, echoed whole and computed without any cache: with
    labels, or with prompt_logprobs above the scored-prefix cache's top-k."""
    uncached = {} if "logprob_token_ids" in fields else {"prompt_logprobs": CACHED_TOP_K + 1}
    logprobs = complete(model=model, prompt=ids, max_tokens=1, temperature=0, echo=True,
                        **fields, **uncached)["choices"][0]["logprobs"]
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
def test_choices_of_one_context_read_it_from_the_cache_and_score_exactly(complete, references, family,
                                                                         scores):
    reference, fields = references[family], SCORES[scores]
    context, choices = context_and_choices(reference, family, seed=f"{family}/{scores}")
    start = len(context)
    hit = whole_blocks(family, start - 1)  # the cut: positions before start - 1
    before = cache_reads(family)
    for choice in choices:
        ids = context + choice
        cached = span(complete, family, ids, start, **fields)
        assert cached["token_ids"] == choice
        rows = reference.prompt_rows(ids)
        np.testing.assert_allclose(cached["token_logprobs"],
                                   [rows[p][ids[p]] for p in range(start, len(ids))], atol=TOLERANCE)
        assert_same_span(cached, echoed_from(complete, family, ids, start, **fields))
    # Each choice after the first read the hit; the echoed ones, computed whole, read nothing.
    assert read_since(family, before, (CHOICES - 1) * hit) == (CHOICES - 1) * hit


# Sent together as a span (each follower reads the context's first block from the KV cache,
# as far as its span allows) or echoed (the context's whole blocks from the scored cache), with
# this many tokens after the context's two blocks.
TOGETHER = {"span": 0, "echo": 50}


@pytest.mark.parametrize("form", TOGETHER)
@pytest.mark.parametrize("family", [family for family in FAMILIES if family != SMALL_QUEUE_MODEL])
def test_choices_sent_together_compute_their_context_once(complete, references, family, form):
    """One batch of the four choices: the ingress sends its prompts to the engine at once, and
    the three that find the first computing their context wait for it, then read it. (Not on
    the model whose queue the overload tests keep at two in flight and two waiting.)"""
    reference = references[family]
    context, choices = context_and_choices(reference, family, seed=f"{family}/together/{form}",
                                           extra=TOGETHER[form])
    start = len(context)
    fields = {"logprob_start_len": start} if form == "span" else {"echo": True}
    read = whole_blocks(family, start - 1)
    before = cache_reads(family)
    answer = complete(model=family, prompt=[context + choice for choice in choices], max_tokens=1,
                      temperature=0, logprobs=1, **fields)
    hits = (CHOICES - 1) * read
    assert read_since(family, before, hits) == hits
    first = 0 if form == "span" else start
    for choice, answered in zip(choices, sorted(answer["choices"], key=lambda c: c["index"]), strict=True):
        ids = context + choice
        rows = reference.prompt_rows(ids)
        assert answered["logprobs"]["token_ids"][first:first + len(choice)] == choice
        np.testing.assert_allclose(answered["logprobs"]["token_logprobs"][first:first + len(choice)],
                                   [rows[p][ids[p]] for p in range(start, len(ids))], atol=TOLERANCE)


# The scored-prefix cache: requests that show every prompt row (echo, prompt_logprobs up to its
# top-k) get the rows of a scored prefix from it. Its blocks are the KV cache's: with blocks of
# 128, block b holds positions 128b + 1 .. 128(b + 1), so the choices of a 306-token context
# share its first 256.
HARNESS = {"echo": {"echo": True, "logprobs": 1}, "top-5 echo": {"echo": True, "logprobs": CACHED_TOP_K},
           "prompt_logprobs": {"prompt_logprobs": 2},
           "n = 2, sampled": {"echo": True, "logprobs": 1, "n": 2, "temperature": 1.0, "seed": 7}}


def scored(complete, model: str, ids: list[int], **fields) -> list[dict]:
    return complete(model=model, prompt=ids, max_tokens=1, **{"temperature": 0, **fields})["choices"]


def assert_same_rows(cached: dict, uncached: dict, length: int) -> None:
    """Every prompt row of an answer as another (with a wider prompt top-k) gives it: the
    echoed logprobs, and each prompt_logprobs entry if asked."""
    if cached["logprobs"] is not None:
        assert_same_span(*({field: choice["logprobs"][field][1:length] for field in FIELDS}
                           for choice in (cached, uncached)))  # position 0 has no logprob
    if "prompt_logprobs" not in cached:
        return
    for at, expected in zip(cached["prompt_logprobs"], uncached["prompt_logprobs"], strict=True):
        assert (at is None) == (expected is None)
        for token, entry in (at or {}).items():
            assert entry["rank"] == expected[token]["rank"]
            assert abs(entry["logprob"] - expected[token]["logprob"]) <= TOLERANCE


@pytest.mark.parametrize("family", FAMILIES)
def test_an_evaluation_harness_gets_the_contexts_rows_from_the_scored_cache(complete, references, family):
    """Every shape a harness sends (and n > 1), for each choice of one context: the first
    request computes the context, every later one (of any shape) gets its rows from the
    scored cache."""
    reference = references[family]
    context, choices = context_and_choices(reference, family, seed=f"{family}/harness", extra=50)
    known = whole_blocks(family, len(context) - 1)  # rows 1..256 on blocks of 128
    before = counted(family)
    for choice in choices:
        ids = context + choice
        rows = reference.prompt_rows(ids)
        for fields in HARNESS.values():
            cached = scored(complete, family, ids, **fields)
            # prompt_logprobs above the cache's top-k: computed whole
            uncached = scored(complete, family, ids, **{**fields, "prompt_logprobs": CACHED_TOP_K + 1})
            assert len(cached) == len(uncached) == fields.get("n", 1)
            for choice in cached:  # each of n choices shows the prompt's rows
                assert_same_rows(choice, uncached[0], len(ids))
                if choice["logprobs"] is not None:
                    np.testing.assert_allclose(choice["logprobs"]["token_logprobs"][1:len(ids)],
                                               [rows[p][ids[p]] for p in range(1, len(ids))], atol=TOLERANCE)
    # Every request after the first got the context's rows from the scored cache and read their
    # blocks from the KV cache; the wider ones, computed whole, neither.
    served, after = (CHOICES * len(HARNESS) - 1) * known, counted(family)
    for total in ("scored_from_cache", "cache_read"):
        assert after[total] - before[total] == served, total


def test_a_flood_of_distinct_prefixes_keeps_the_byte_bound_and_the_answers_right(complete, references,
                                                                                  metrics_url):
    """The scored cache of the model configured small (tests/e2e/conftest.py) holds a few
    contexts: a flood of distinct ones evicts the oldest, the cache stays within its bytes, the
    last one is served from it, the first is computed again, and every answer is the
    reference's."""
    reference = references[SMALL_CACHE_MODEL]
    contexts = [context_and_choices(reference, SMALL_CACHE_MODEL, seed=f"flood/{index}", extra=10)[0]
                for index in range(12)]

    def echoed(ids: list[int]) -> None:
        (choice,) = scored(complete, SMALL_CACHE_MODEL, ids, echo=True, logprobs=1)
        rows = reference.prompt_rows(ids)
        np.testing.assert_allclose(choice["logprobs"]["token_logprobs"][1:len(ids)],
                                   [rows[p][ids[p]] for p in range(1, len(ids))], atol=TOLERANCE)

    for ids in contexts:
        echoed(ids)
    time.sleep(REPORT_S)
    held = exported(metrics_url, SCORED_BYTES, SMALL_CACHE_MODEL)
    assert 0 < held <= SMALL_CACHE_BYTES
    for ids, served in ((contexts[-1], 2 * KV_BLOCKS[SMALL_CACHE_MODEL]), (contexts[0], 0)):
        before = counted(SMALL_CACHE_MODEL)["scored_from_cache"]
        echoed(ids)
        assert counted(SMALL_CACHE_MODEL)["scored_from_cache"] - before == served
