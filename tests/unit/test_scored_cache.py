"""The scored-prefix cache on an engine stand-in whose rows depend on the whole prefix: what a
request asks the engine, what it gets back, what is kept, and what is never served."""

import dataclasses

import numpy as np
import pytest

from serve_app.engine.scored_cache import ScoredPrefixCache, entry_keys
from serve_app.engine.wire import EngineRequest, EngineResult, PositionLogprobs

BLOCK, TOP_K = 4, 3


def request(prompt: list[int], k: int = 1, **fields) -> EngineRequest:
    return EngineRequest(prompt_token_ids=prompt, max_tokens=1, temperature=0.0, top_p=1.0,
                         prompt_logprobs=k, **{"tenant": "t", "priority": 0, **fields})


def row(prompt: list[int], position: int, width: int) -> tuple[list[int], list[float], list[int]]:
    """The engine stand-in's row at `position`: a function of the tokens up to it."""
    seed = hash(tuple(prompt[:position + 1])) % 1000
    return ([prompt[position]] + [seed + j for j in range(width - 1)],
            [-seed / 100 - j for j in range(width)], [seed % 7 + 1] + list(range(1, width)))


def engine(asked: EngineRequest) -> EngineResult:
    """Rows from `prompt_rows_from` on (at least position 1), zeros before, as the fence leaves
    them; `prompt_logprobs + 1` entries a row."""
    prompt, width = asked.prompt_token_ids, asked.prompt_logprobs + 1
    rows = [([0] * width, [0.0] * width, [0] * width) if p < asked.prompt_rows_from else row(prompt, p, width)
            for p in range(1, len(prompt))]
    offsets = np.arange(len(prompt) + 1, dtype=np.int64) * width - width
    offsets[0] = 0
    ids, logprobs, ranks = (np.asarray([v for r in rows for v in r[i]]) for i in range(3))
    positions = PositionLogprobs(offsets, ids.astype(np.int32), logprobs.astype(np.float32),
                                 ranks.astype(np.int64))
    return EngineResult(prompt_token_ids=np.asarray(prompt, np.int32), prompt_logprobs=positions,
                        completions=[])


def expected(prompt: list[int], k: int) -> list[tuple]:
    return [tuple(np.asarray(v).tolist() for v in row(prompt, p, k + 1)) for p in range(1, len(prompt))]


def shown(result: EngineResult, k: int) -> list[tuple]:
    rows = result.prompt_logprobs
    assert not rows.is_scored(0) and len(rows) == len(result.prompt_token_ids)
    found = []
    for p in range(1, len(rows)):
        first, last = rows.offsets[p], rows.offsets[p + 1]
        assert last - first == k + 1
        found.append((rows.token_ids[first:last].tolist(), np.round(rows.logprobs[first:last], 5).tolist(),
                      rows.ranks[first:last].tolist()))
    return found


def rounded(rows: list[tuple]) -> list[tuple]:
    return [(ids, np.round(np.asarray(lps, np.float32), 5).tolist(), ranks) for ids, lps, ranks in rows]


def ask(cache: ScoredPrefixCache, asked: EngineRequest, namespace: str = ""):
    plan = cache.plan(asked, namespace)
    return plan, cache.complete(plan, engine(plan.engine_request))


CONTEXT = list(range(20, 33))  # 13 tokens: rows 1..12, three whole blocks


def test_a_prefix_scored_once_is_served_and_only_the_rest_computed():
    cache = ScoredPrefixCache(BLOCK, TOP_K, 1 << 20)
    plan, first = ask(cache, request(CONTEXT, k=1))
    assert plan.known is None and plan.engine_request.prompt_rows_from == 1
    assert plan.engine_request.prompt_logprobs == TOP_K
    assert shown(first, 1) == rounded(expected(CONTEXT, 1))
    assert len(cache.entries) == 3
    prompt = CONTEXT + [7, 8]
    plan, second = ask(cache, request(prompt, k=2))
    assert plan.known.count == 12 and plan.engine_request.prompt_rows_from == 13
    assert shown(second, 2) == rounded(expected(prompt, 2))


def test_a_changed_token_ends_what_is_known():
    cache = ScoredPrefixCache(BLOCK, TOP_K, 1 << 20)
    ask(cache, request(CONTEXT))
    changed = CONTEXT[:6] + [99] + CONTEXT[7:]
    plan, result = ask(cache, request(changed))
    assert plan.known.count == 4  # block 0 (positions 1-4) only: position 6 is in block 1
    assert shown(result, 1) == rounded(expected(changed, 1))


def test_an_entry_whose_tokens_differ_from_its_key_is_never_served():
    cache = ScoredPrefixCache(BLOCK, TOP_K, 1 << 20)
    ask(cache, request(CONTEXT))
    key = entry_keys("", CONTEXT, BLOCK)[0]
    entry = cache.entries[key]
    cache.entries[key] = dataclasses.replace(entry, tokens=entry.tokens + 1)  # as a hash collision
    assert cache.plan(request(CONTEXT), "").known is None


def test_tenants_do_not_see_each_others_entries():
    cache = ScoredPrefixCache(BLOCK, TOP_K, 1 << 20)
    ask(cache, request(CONTEXT), "alpha")
    assert cache.plan(request(CONTEXT), "beta").known is None
    assert cache.plan(request(CONTEXT), "alpha").known.count == 12


def test_the_byte_bound_holds_and_the_least_recently_used_go_first():
    one_entry = ScoredPrefixCache(BLOCK, TOP_K, 1 << 20)
    ask(one_entry, request(CONTEXT[:5]))
    size = one_entry.bytes
    cache = ScoredPrefixCache(BLOCK, TOP_K, 3 * size)
    prompts = [[start] + CONTEXT[1:5] for start in range(1, 5)]
    for prompt in prompts[:3]:
        ask(cache, request(prompt))
    cache.plan(request(prompts[0]), "")  # used: now the most recent
    ask(cache, request(prompts[3]))
    assert cache.bytes <= 3 * size and len(cache.entries) == 3
    assert cache.plan(request(prompts[1]), "").known is None
    assert cache.plan(request(prompts[0]), "").known.count == BLOCK
    for flood in range(50):
        ask(cache, request([100 + flood] + CONTEXT[1:9]))
        assert cache.bytes <= 3 * size


@pytest.mark.parametrize("fields, eligible", [
    ({"k": 1}, True), ({"k": TOP_K}, True), ({"k": TOP_K + 1}, False), ({"k": -1}, False),
    ({"k": 0, "logprob_token_ids": [3]}, False), ({"k": 1, "prompt_rows_from": 5}, False),
    ({"k": None}, False),
])
def test_what_the_cache_takes(fields, eligible):
    assert ScoredPrefixCache(BLOCK, TOP_K, 1 << 20).eligible(request(CONTEXT, **fields)) == eligible
