"""The same request gives the same bits whatever else is in flight (docs/api.md "Determinism"):
on each tokenizer family's model, a request of every scoring kind answered alone and among
concurrent requests of 5 to 300 tokens, every number compared bit for bit (the shortest digits
of a float32 that JSON carries, a full vocabulary's .npy bytes); on the SentencePiece model,
whose engine step computes at most STEP_TOKENS, a long prompt is split across steps (vLLM's
chunked prefill), at other places alone than among others. Across the caches, bit for bit
too: rows served from the scored-prefix cache against the same rows computed again, and a span
whose context is read from the KV cache against the same span computed whole."""

import random
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from ray import serve

from serve_app.engine.wire import ONLINE
from serve_app.ops.app import model_deployment_name
from serve_app.ops.local_ray import APP_NAME
from tests.e2e.conftest import CONFIG, FAMILIES, KV_BLOCKS, MAX_SCORED, STEP_TOKENS
from tests.e2e.test_conversation_scoring import TEMPLATED
from tests.e2e.test_prefix_reuse import (
    CACHED_TOP_K,
    cache_reads,
    context_and_choices,
    counted,
    read_since,
    span,
    whole_blocks,
)
from tests.e2e.waiting import poll_until

CROWD = 40
LONGEST = 300  # tokens of the longest request among the others
# Echoed whole: in three engine steps on the model whose step is bounded, alone as among others.
LONG = MAX_SCORED - 20
assert LONG > 2 * max(STEP_TOKENS.values())
SCORED = {"max_tokens": 1, "temperature": 0}


def distinct_ids(rng: random.Random, count: int) -> list[int]:
    """A prompt of random ids that no other request of the session shares a prefix with."""
    return [rng.randrange(10, 250) for _ in range(count)]


def probes(model: str, rng: random.Random) -> dict[str, tuple[str, dict]]:
    """One request of each scoring kind, as (path, body): kind."""
    ids = lambda count: distinct_ids(rng, count)  # noqa: E731
    completions = {
        "echo, top 8": {"prompt": ids(90), "echo": True, "logprobs": 8},
        "prompt_logprobs, top 6": {"prompt": ids(70), "prompt_logprobs": 6},
        "a full vocabulary's window": {"prompt": ids(60), "prompt_logprobs": -1},
        "labels": {"prompt": ids(50), "echo": True, "logprobs": 0, "logprob_token_ids": [5, 17, 40]},
        "a span": {"prompt": ids(2 * KV_BLOCKS[model] + 20), "logprob_start_len": 2 * KV_BLOCKS[model],
                   "logprobs": 3},
        "generated, top 4": {"prompt": ids(40), "max_tokens": 6, "logprobs": 4},
        f"{LONG} tokens echoed": {"prompt": ids(LONG), "echo": True, "logprobs": 2},
    }
    kinds = {kind: ("/v1/completions", {**SCORED, "model": model, **body})
             for kind, body in completions.items()}
    if model in TEMPLATED:
        messages = [{"role": "user", "content": "Name a colour of the sky at noon."},
                    {"role": "assistant", "content": "Blue, mostly, with white clouds."}]
        kinds["a conversation's final message"] = ("/v1/chat/completions", {
            **SCORED, "model": model, "messages": messages, "score_final_message": True, "top_logprobs": 3})
    return kinds


def others(model: str, rng: random.Random) -> list[tuple[str, dict]]:
    """Requests of 5 to 300 tokens, some generating, some echoing their prompts."""
    return [("/v1/completions", {"model": model, "prompt": distinct_ids(rng, rng.randrange(5, LONGEST)),
                                 "max_tokens": rng.randrange(1, 8), "temperature": 0,
                                 **({"echo": True, "logprobs": 2} if i % 2 else {"logprobs": 1})})
            for i in range(CROWD)]


def answer(http: httpx.Client, path: str, body: dict) -> list | bytes:
    """What must not depend on the others: the choices, or a full vocabulary's .npy bytes."""
    full = body.get("prompt_logprobs") == -1
    response = http.post(path, json=body, headers={"accept": "application/x-npy"} if full else {})
    assert response.status_code == 200, response.text[:300]
    return response.content if full else response.json()["choices"]


def first_difference(got, expected, where: str = "") -> str | None:
    """Where two answers first differ, with both values; None where every value is the same."""
    if isinstance(got, dict) and isinstance(expected, dict) and got.keys() == expected.keys():
        return next(filter(None, (first_difference(got[k], expected[k], f"{where}.{k}") for k in got)), None)
    if isinstance(got, list) and isinstance(expected, list) and len(got) == len(expected):
        return next(filter(None, (first_difference(g, e, f"{where}[{i}]")
                                  for i, (g, e) in enumerate(zip(got, expected, strict=True)))), None)
    if isinstance(got, bytes) and isinstance(expected, bytes) and got != expected:
        at = next((i for i, (g, e) in enumerate(zip(got, expected)) if g != e), min(len(got), len(expected)))
        return f"{where}: {len(got)} bytes against {len(expected)}, first apart at byte {at}"
    return None if got == expected else f"{where}: {got!r:.120} against {expected!r:.120}"


def engine_places(model: str) -> int:
    (settings,) = [m for m in CONFIG["models"] if m["name"] == model]
    return settings.get("max_ongoing_requests", 128)


def among_others(http, model: str, probes: dict, crowd: list, reference) -> dict:
    """Each probe's answer sent among others: with the whole crowd at once, or on a model whose
    engine takes fewer (the overload tests' model takes two), each beside a long generation
    already in the engine."""
    if len(crowd) + len(probes) <= engine_places(model):
        return with_the_crowd(http, probes, crowd)
    return beside_a_long_one(http, model, probes, reference)


def with_the_crowd(http, probes: dict, crowd: list) -> dict:
    """Half the crowd, the probes, the other half: the probes share the others' steps."""
    with ThreadPoolExecutor(len(crowd) + len(probes)) as pool:
        busy = [pool.submit(answer, http, *request) for request in crowd[:len(crowd) // 2]]
        probed = {kind: pool.submit(answer, http, *request) for kind, request in probes.items()}
        busy += [pool.submit(answer, http, *request) for request in crowd[len(crowd) // 2:]]
        for future in busy:
            future.result()
        return {kind: future.result() for kind, future in probed.items()}


def beside_a_long_one(http, model: str, probes: dict, reference) -> dict:
    long = ("/v1/completions", {"model": model, "prompt": distinct_ids(random.Random(model), 50),
                                "max_tokens": 200, "temperature": 0, "logprobs": 1,
                                "logit_bias": {str(i): -100 for i in reference.tokenizer.all_special_ids}})
    replica = serve.get_deployment_handle(model_deployment_name(model), app_name=APP_NAME)
    answers = {}
    with ThreadPoolExecutor(1) as pool:
        for kind, request in probes.items():
            other = pool.submit(answer, http, *long)
            poll_until(lambda: replica.under_way_at.remote(ONLINE).result(), 60, "the long one in the engine",
                       pause_s=0.01)
            answers[kind] = answer(http, *request)
            other.result()
    return answers


@pytest.mark.parametrize("family", FAMILIES)
def test_every_scoring_kind_gives_the_same_bits_alone_and_among_others(http, references, family):
    """Each probe is sent once first, so that the span and the generation read their context
    from the KV cache both times after (what changes with a cache is below)."""
    rng = random.Random(f"determinism/{family}")
    kinds, crowd = probes(family, rng), others(family, rng)
    for request in kinds.values():
        answer(http, *request)
    alone = {kind: answer(http, *request) for kind, request in kinds.items()}
    together = among_others(http, family, kinds, crowd, references[family])
    differences = {kind: first_difference(together[kind], alone[kind]) for kind in kinds}
    assert not any(differences.values()), differences


@pytest.mark.parametrize("family", FAMILIES)
def test_rows_from_the_scored_cache_are_the_bits_computed_again(complete, references, family):
    """A harness's echo computed, then served from the scored-prefix cache, then computed again
    (a prompt top-k wider than the cache keeps): the same bits all three times."""
    context, choices = context_and_choices(references[family], family, seed=f"{family}/determinism", extra=20)
    ids, echo = context + choices[0], {"echo": True, "logprobs": CACHED_TOP_K}
    computed = complete(model=family, prompt=ids, **SCORED, **echo)["choices"][0]["logprobs"]
    before = counted(family)["scored_from_cache"]
    served = complete(model=family, prompt=ids, **SCORED, **echo)["choices"][0]["logprobs"]
    assert counted(family)["scored_from_cache"] - before == whole_blocks(family, len(ids) - 1)
    again = complete(model=family, prompt=ids, **SCORED, **echo,
                     prompt_logprobs=CACHED_TOP_K + 1)["choices"][0]["logprobs"]
    assert first_difference(served, computed) is None
    assert first_difference(again, computed) is None


@pytest.mark.parametrize("family", FAMILIES)
def test_a_span_read_from_the_kv_cache_is_the_bits_computed_whole(complete, references, family):
    """The span's context computed with it the first time, read from vLLM's prefix cache the
    second (the attention over cached blocks is another kernel call than over the prompt)."""
    context, choices = context_and_choices(references[family], family, seed=f"{family}/determinism-span")
    ids, start = context + choices[0], len(context)
    before = cache_reads(family)
    whole = span(complete, family, ids, start, logprobs=5)
    assert cache_reads(family) == before
    cached = span(complete, family, ids, start, logprobs=5)
    hit = whole_blocks(family, start - 1)
    assert read_since(family, before, hit) == hit
    assert first_difference(cached, whole) is None
