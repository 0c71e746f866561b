"""prompt_logprobs: -1, the whole distribution at every prompt position, streamed."""

import gzip
import io
import random

import httpx
import numpy as np
import orjson
import pytest
import ray
from ray import serve

from serve_app.config import model_deployment_name
from serve_app.engine.windows import RUN_AHEAD, stream_items_ahead, window_starts
from serve_app.engine.wire import EngineRequest, EngineResult
from serve_app.ops.local_ray import APP_NAME
from tests.e2e.conftest import (
    CHUNK_POSITIONS,
    FAMILIES,
    FULL_VOCAB_MAX,
    FULL_VOCAB_WINDOW,
    KV_BLOCKS,
    MODEL,
)
from tests.e2e.inspected_replica import PROMPT_KEPT
from tests.e2e.reference import TOLERANCE, assert_rank
from tests.e2e.test_prefix_reuse import cache_reads, read_since
from tests.e2e.waiting import poll_until

TEXT = "The capital of France is"
PAUSED_LIMIT_S = 60
UNREAD_S = 2  # how long an unread stream must stay unfinished: far longer than it takes to end


def full_vocab(http, prompt, encoding="gzip", **fields):
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "prompt_logprobs": -1, **fields}
    with http.stream("POST", "/v1/completions", json=body,
                     headers={"accept-encoding": encoding}) as response:
        raw = b"".join(response.iter_raw())
    assert response.status_code == 200, raw[:500]
    return response, raw


def test_every_position_is_the_whole_distribution(http, reference):
    response, raw = full_vocab(http, TEXT)
    assert response.headers["content-encoding"] == "gzip"
    body = orjson.loads(gzip.decompress(raw))
    ids = reference.tokenizer.encode(TEXT)
    rows = reference.prompt_rows(ids)
    positions = body["choices"][0]["prompt_logprobs"]
    assert len(positions) == len(ids) and positions[0] is None
    for p in range(1, len(ids)):
        entries = positions[p]
        assert len(entries) == rows.shape[1]
        token_ids = np.array([int(t) for t in entries])
        logprobs = np.array([e["logprob"] for e in entries.values()])
        ranks = [e["rank"] for e in entries.values()]
        assert sorted(token_ids.tolist()) == list(range(rows.shape[1]))
        np.testing.assert_allclose(logprobs, rows[p][token_ids], atol=TOLERANCE)
        assert sorted(ranks) == list(range(1, len(ranks) + 1))  # in vLLM's order: test_logprobs_order
        assert_rank(rows[p], ids[p], entries[str(ids[p])]["rank"])
        assert entries[str(ids[p])]["decoded_token"] == reference.tokenizer.decode([ids[p]])


def test_a_one_token_prompt_has_only_the_null_position(http):
    _, raw = full_vocab(http, [5], echo=True, logprobs=1)
    choice = orjson.loads(gzip.decompress(raw))["choices"][0]
    assert choice["prompt_logprobs"] == [None]
    assert choice["logprobs"]["token_logprobs"][0] is None


def test_plain_body_without_gzip(http):
    response, raw = full_vocab(http, [5, 6, 7], encoding="identity")
    assert "content-encoding" not in response.headers
    positions = orjson.loads(raw)["choices"][0]["prompt_logprobs"]
    assert positions[0] is None and len(positions) == 3


def test_batch_n_and_echo_share_the_arrays(http, reference):
    _, raw = full_vocab(http, [TEXT, "x = 1"], echo=True, logprobs=2, n=2, temperature=0)
    choices = orjson.loads(gzip.decompress(raw))["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    for choice, prompt in zip(choices, [TEXT, TEXT, "x = 1", "x = 1"], strict=True):
        ids = reference.tokenizer.encode(prompt)
        rows = reference.prompt_rows(ids)
        assert len(choice["prompt_logprobs"]) == len(ids)
        echoed = choice["logprobs"]["token_logprobs"][1:len(ids)]
        np.testing.assert_allclose(echoed, [rows[p][ids[p]] for p in range(1, len(ids))],
                                   atol=TOLERANCE)


def test_the_cap_on_prompt_length(http):
    too_long = list(range(1, FULL_VOCAB_MAX + 2))
    response = http.post("/v1/completions", json={"model": MODEL, "prompt": too_long,
                                                  "max_tokens": 1, "prompt_logprobs": -1})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("full_vocab_prompt_too_long", "prompt")
    assert str(FULL_VOCAB_MAX) in error["message"]
    full_vocab(http, too_long[:FULL_VOCAB_MAX])


def test_completion_logprobs_cannot_be_minus_one(http):
    response = http.post("/v1/completions", json={"model": MODEL, "prompt": TEXT, "logprobs": -1})
    assert response.status_code == 400 and response.json()["error"]["param"] == "logprobs"


def test_abandoned_bodies_give_their_slot_back(base_url, http):
    """More clients than full-vocabulary slots hang up after the first bytes; the next request
    must still be served (a leaked slot would make it wait forever)."""
    body = {"model": MODEL, "prompt": list(range(1, 101)), "max_tokens": 1, "prompt_logprobs": -1}
    for _ in range(5):
        with httpx.Client(base_url=base_url, timeout=60) as client:
            with client.stream("POST", "/v1/completions", json=body,
                               headers={"accept-encoding": "identity"}) as response:
                assert response.status_code == 200
                next(response.iter_raw())
    response, raw = full_vocab(http, TEXT)
    assert orjson.loads(gzip.decompress(raw))["choices"][0]["prompt_logprobs"][0] is None


def npy_records(http, body: dict) -> tuple[httpx.Response, np.ndarray]:
    with http.stream("POST", "/v1/completions", json=body,
                     headers={"accept": "application/x-npy", "accept-encoding": "gzip"}) as response:
        raw = b"".join(response.iter_raw())
    assert response.status_code == 200, raw[:500]
    return response, np.load(io.BytesIO(raw))


def test_the_binary_form_is_every_distribution_in_token_order(http, reference):
    prompts = [TEXT, "Paris"]
    body = {"model": MODEL, "prompt": prompts, "max_tokens": 1, "prompt_logprobs": -1, "n": 2}
    response, records = npy_records(http, body)
    assert response.headers["content-type"] == "application/x-npy"
    assert "content-encoding" not in response.headers  # never compressed
    ids = [reference.tokenizer.encode(p) for p in prompts]
    assert len(records) == sum(map(len, ids))  # one record per position, once per prompt
    for index, prompt_ids in enumerate(ids):
        mine = records[records["prompt"] == index]
        assert mine["token_id"].tolist() == prompt_ids
        assert mine["position"].tolist() == list(range(len(prompt_ids)))
        assert np.isnan(mine["logprobs"][0]).all()
        np.testing.assert_allclose(mine["logprobs"][1:], reference.prompt_rows(prompt_ids)[1:],
                                   atol=TOLERANCE)


def test_the_binary_and_json_forms_agree(http):
    prompt = list(range(5, 5 + FULL_VOCAB_MAX))
    _, records = npy_records(http, {"model": MODEL, "prompt": prompt, "max_tokens": 1,
                                    "prompt_logprobs": -1})
    _, raw = full_vocab(http, prompt)
    positions = orjson.loads(gzip.decompress(raw))["choices"][0]["prompt_logprobs"]
    for position in (1, FULL_VOCAB_MAX // 2, FULL_VOCAB_MAX - 1):
        entries = positions[position]
        token_ids = [int(t) for t in entries]
        logprobs = np.array([e["logprob"] for e in entries.values()], np.float32)
        assert records["logprobs"][position][token_ids].tolist() == logprobs.tolist()


def random_prompt(reference, seed: str, length: int) -> list[int]:
    """Ids no other test sends: no prefix cache holds them yet."""
    rng = random.Random(seed)
    return [rng.randrange(10, len(reference.tokenizer) - 1) for _ in range(length)]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_long_prompt_is_computed_in_windows_that_read_the_ones_before(http, references, family):
    """300 tokens in windows of 128 positions: the second reads 128 tokens of the first from the
    KV cache, the third 256 (on blocks of 32, the first window is one block: the others read
    32, 128 and 256), in `.npy` on every family, and in JSON (both choices of n = 2, with the
    echo's top-2 joined over the windows) on the first; every row is the reference's."""
    reference = references[family]
    ids = random_prompt(reference, f"windows/{family}", FULL_VOCAB_MAX)
    rows = reference.prompt_rows(ids)
    before = cache_reads(family)
    _, records = npy_records(http, {"model": family, "prompt": ids, "max_tokens": 1, "prompt_logprobs": -1})
    assert records["position"].tolist() == list(range(len(ids))) and records["token_id"].tolist() == ids
    np.testing.assert_allclose(records["logprobs"][1:], rows[1:], atol=TOLERANCE)
    if family == MODEL:
        assert_windowed_json(http, family, ids, rows)
    starts = window_starts(1, len(ids) - 1, FULL_VOCAB_WINDOW, KV_BLOCKS[family])
    reads = (2 if family == MODEL else 1) * sum(start - 1 for start in starts[1:])
    assert read_since(family, before, reads) == reads


def assert_windowed_json(http, family: str, ids: list[int], rows: np.ndarray) -> None:
    _, raw = full_vocab(http, ids, model=family, echo=True, logprobs=2, n=2, temperature=1.0, seed=3)
    first, second = orjson.loads(gzip.decompress(raw))["choices"]
    assert second["prompt_logprobs"] == first["prompt_logprobs"]
    positions = first["prompt_logprobs"]
    assert len(positions) == len(ids) and positions[0] is None
    for p in range(1, len(ids)):
        token_ids = np.array([int(t) for t in positions[p]])
        logprobs = np.array([e["logprob"] for e in positions[p].values()])
        assert len(token_ids) == rows.shape[1]
        np.testing.assert_allclose(logprobs, rows[p][token_ids], atol=TOLERANCE)
    for choice in (first, second):
        echoed = choice["logprobs"]
        np.testing.assert_allclose(echoed["token_logprobs"][1:len(ids)],
                                   rows[np.arange(1, len(ids)), ids[1:]], atol=TOLERANCE)
        for p in (1, 128, 129, 256, 257, 299):
            top = list(echoed["top_logprobs"][p].values())[:2]
            np.testing.assert_allclose(top, np.sort(rows[p])[::-1][:2], atol=TOLERANCE)


@pytest.mark.usefixtures("base_url")  # the session's service, whose replica it calls
def test_a_replica_computes_a_bounded_run_of_windows_ahead_of_its_caller():
    """Ray Serve streams with no backpressure of its own: a stream nobody reads runs to its
    end (the token stream below), and a full-vocabulary one left every window's rows in Ray's
    object store. The model's router sends it with Ray's generator backpressure
    (serve_app.front.replica_router): the replica pauses with two windows' items untaken."""
    replica = serve.get_deployment_handle(model_deployment_name(MODEL), app_name=APP_NAME)
    tokens = EngineRequest(prompt_token_ids=list(range(5, 15)), max_tokens=40, temperature=0.0, top_p=1.0,
                           tenant="t", priority=0)
    unread_tokens = replica.options(stream=True).generate_stream.remote(tokens)._to_object_ref_gen_sync()
    prompt = list(range(600, 600 + FULL_VOCAB_MAX))  # no other test's: its windows are this one's
    rows = EngineRequest(prompt_token_ids=prompt, max_tokens=1, temperature=0.0, top_p=1.0,
                         prompt_logprobs=-1, tenant="t", priority=0)
    call = replica.options(stream=True, _by_reference=True).generate_full_vocab.remote(rows)
    unread_rows = call._to_object_ref_gen_sync()
    assert ray.wait([unread_tokens.completed()], timeout=PAUSED_LIMIT_S)[0], "the token stream stopped unread"

    def paused() -> bool:  # its run ahead computed, nothing left in the engine
        windows_computed = len(replica.cache_reads.remote(prompt[:PROMPT_KEPT]).result())
        return windows_computed >= RUN_AHEAD and replica.unfinished_requests.remote().result() == 0

    poll_until(paused, PAUSED_LIMIT_S, "the replica's run of windows ahead")
    # Left unread, the rows' stream waits for its caller instead of ending (without the
    # backpressure, the rest of it took milliseconds).
    assert not ray.wait([unread_rows.completed()], timeout=UNREAD_S)[0], "every window was computed unread"
    items = [ray.get(ref) for ref in unread_rows]
    windows = window_starts(1, FULL_VOCAB_MAX - 1, FULL_VOCAB_WINDOW, FULL_VOCAB_WINDOW)
    assert sum(isinstance(item, EngineResult) for item in items) == len(windows) > RUN_AHEAD
    assert len(items) > stream_items_ahead(FULL_VOCAB_WINDOW, CHUNK_POSITIONS)
