"""A model whose engine spans two CPU workers, as tensor ranks or as pipeline stages, answers
every scoring path as the one-worker engine of the same weights does, within float32's
rounding of another summation order: echo with top-k, prompt top-k, the full vocabulary as
JSON and `.npy`, labels, a span after a priming request (read from the prefix cache),
conversation scoring and a batch line; each replica reserves its workers in a placement group
and each worker computes on cores of its own; a worker lost takes its replica down whole."""

import gzip
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import orjson
import psutil
import pytest
from ray import serve

from serve_app.config import model_deployment_name
from serve_app.ops.local_ray import APP_NAME
from tests.e2e.conftest import MODEL, SPLIT_MODELS
from tests.e2e.test_batch import request_line, results, run_batch
from tests.e2e.test_faults import RECOVERY_LIMIT_S, wait_until_healthy
from tests.e2e.test_full_vocab import npy_records
from tests.e2e.test_prefix_reuse import cache_reads, context_and_choices, read_since, span, whole_blocks

# Two workers sum a layer's products in another order than one: within 1e-5, and 2e-6 of the
# value's size for the full vocabulary's least likely tokens (a few float32 steps at -15).
ATOL, RTOL = 1e-5, 2e-6
# What differs between two answers of the same scores on two models.
OWN = {"id", "created", "model", "usage", "system_fingerprint", "request_id"}


def assert_same_answer(got, expected, where="") -> None:
    """Two JSON answers alike in every key, string and integer, their floats within ATOL and RTOL."""
    if isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys(), (where, got, expected)
        for key in expected.keys() - OWN:
            assert_same_answer(got[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), (where, got, expected)
        for index, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
            assert_same_answer(mine, theirs, f"{where}[{index}]")
    elif isinstance(expected, float):
        assert isinstance(got, float), (where, got, expected)
        assert abs(got - expected) <= ATOL + RTOL * abs(expected), (where, got, expected)
    else:
        assert got == expected and type(got) is type(expected), (where, got, expected)


def both(http, path: str, split: str, **body) -> tuple[dict, dict]:
    answers = []
    for model in (split, MODEL):
        response = http.post(path, json={**body, "model": model})
        assert response.status_code == 200, response.text
        answers.append(response.json())
    return answers[0], answers[1]


@pytest.fixture(scope="module", autouse=True)
def awake(base_url):
    """Each split model woken from zero replicas (tests/e2e/conftest.py), both at once."""
    def wake(model: str) -> int:
        body = {"model": model, "prompt": "Wake up", "max_tokens": 1}
        return httpx.post(f"{base_url}/v1/completions", json=body, timeout=900).status_code

    with ThreadPoolExecutor(len(SPLIT_MODELS)) as pool:
        assert list(pool.map(wake, SPLIT_MODELS)) == [200] * len(SPLIT_MODELS)


PROMPTS = ["A short note on the tides, and why they turn twice a day.",
           "Seven ships sailed from the northern port before dawn"]


@pytest.mark.parametrize("split", SPLIT_MODELS)
def test_echo_prompt_top_k_and_generated_top_k_are_the_one_worker_engine_s(http, split):
    answer, one_worker = both(http, "/v1/completions", split, prompt=PROMPTS, max_tokens=4,
                              temperature=0, echo=True, logprobs=5, prompt_logprobs=7)
    assert len(answer["choices"]) == len(PROMPTS)
    assert all(len(choice["prompt_logprobs"]) > 10 for choice in answer["choices"])
    assert_same_answer(answer, one_worker)


@pytest.mark.parametrize("split", SPLIT_MODELS)
def test_labels_at_prompt_and_generated_positions_are_the_one_worker_engine_s(http, split):
    answer, one_worker = both(http, "/v1/completions", split, prompt=PROMPTS[0], max_tokens=3,
                              temperature=0, echo=True, logprobs=0, logprob_token_ids=[5, 17, 300])
    # The labels at each position, and the prompt's own token where it is not one of them.
    assert all(len(top) in (3, 4) for top in answer["choices"][0]["logprobs"]["top_logprobs"][1:])
    assert_same_answer(answer, one_worker)


def full_vocab_rows(http, model: str, prompt: str) -> np.ndarray:
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "prompt_logprobs": -1}
    with http.stream("POST", "/v1/completions", json=body, headers={"accept-encoding": "gzip"}) as response:
        raw = b"".join(response.iter_raw())
    assert response.status_code == 200, raw[:500]
    positions = orjson.loads(gzip.decompress(raw))["choices"][0]["prompt_logprobs"]
    assert positions[0] is None
    rows = np.full((len(positions) - 1, len(positions[1])), np.nan, np.float32)
    for row, entries in zip(rows, positions[1:], strict=True):
        for token, entry in entries.items():
            row[int(token)] = entry["logprob"]
    return rows


@pytest.mark.parametrize("split", SPLIT_MODELS)
def test_the_full_vocabulary_as_json_and_npy_is_the_one_worker_engine_s(http, split):
    prompt = " ".join(PROMPTS) * 3  # over a chunk of positions, within a window
    rows, one_worker = full_vocab_rows(http, split, prompt), full_vocab_rows(http, MODEL, prompt)
    assert rows.shape == one_worker.shape and not np.isnan(rows).any()
    np.testing.assert_allclose(rows, one_worker, atol=ATOL, rtol=RTOL)
    body = {"prompt": prompt, "max_tokens": 1, "prompt_logprobs": -1}
    _, records = npy_records(http, {**body, "model": split})
    _, one_worker_records = npy_records(http, {**body, "model": MODEL})
    assert records["token_id"].tolist() == one_worker_records["token_id"].tolist()
    np.testing.assert_allclose(records["logprobs"][1:], one_worker_records["logprobs"][1:],
                               atol=ATOL, rtol=RTOL)
    np.testing.assert_allclose(records["logprobs"][1:], rows, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("split", SPLIT_MODELS)
def test_a_span_after_its_context_reads_the_prefix_cache_and_scores_as_one_worker(
        complete, reference, split):
    context, choices = context_and_choices(reference, split, seed=f"parallel/{split}")
    start, labels = len(context), {"logprob_token_ids": [10, 11, 12]}
    before = cache_reads(split)
    spans = [span(complete, split, context + choice, start, **labels) for choice in choices]
    hit = whole_blocks(split, start - 1)
    assert read_since(split, before, (len(choices) - 1) * hit) == (len(choices) - 1) * hit
    for choice, scored in zip(choices, spans, strict=True):
        assert scored["token_ids"] == choice
        assert_same_answer(scored, span(complete, MODEL, context + choice, start, **labels))


CONVERSATION = [{"role": "user", "content": "Name a river."},
                {"role": "assistant", "content": "The Danube flows through ten countries."}]


@pytest.mark.parametrize("split", SPLIT_MODELS)
def test_a_scored_conversation_is_the_one_worker_engine_s(http, split):
    answer, one_worker = both(http, "/v1/chat/completions", split, messages=CONVERSATION,
                              max_tokens=1, temperature=0, score_final_message=True, top_logprobs=3)
    assert len(answer["final_message_logprobs"]["content"]) > 3
    assert_same_answer(answer, one_worker)


def test_a_batch_line_on_each_split_model_is_the_one_worker_engine_s(client, http):
    body = {"prompt": PROMPTS[1], "max_tokens": 2, "temperature": 0, "echo": True, "logprobs": 3}
    batch = run_batch(client, [request_line(split, {**body, "model": split}) for split in SPLIT_MODELS])
    assert batch.status == "completed" and batch.request_counts.completed == len(SPLIT_MODELS), batch
    output = results(client, batch.output_file_id)
    one_worker = http.post("/v1/completions", json={**body, "model": MODEL}).json()
    for split in SPLIT_MODELS:
        assert output[split]["response"]["status_code"] == 200
        assert_same_answer(output[split]["response"]["body"], one_worker)


def replica(model: str):
    return serve.get_deployment_handle(model_deployment_name(model), app_name=APP_NAME)


@pytest.mark.parametrize("split", SPLIT_MODELS)
def test_each_replica_reserves_its_workers_and_each_worker_has_a_core_of_its_own(base_url, split):
    assert replica(split).placement_group.remote().result() == {
        "bundles": [{"CPU": 0.2}], "strategy": "STRICT_PACK"}  # two workers' 0.1 CPU, one node
    assert replica(MODEL).placement_group.remote().result() is None
    (engine_core,) = replica(split).engine_core_pids.remote().result()
    workers = psutil.Process(engine_core).children()
    assert len(workers) == 2
    cores = [set(worker.cpu_affinity()) for worker in workers]
    assert cores[0].isdisjoint(cores[1]), cores


def test_a_rank_killed_under_load_takes_its_replica_down_whole_and_a_new_one_answers(base_url, http,
                                                                                      reference):
    """One tensor rank's process killed while requests run on it: each ends with its answer or
    the retryable 503, none hangs; /health says the model is not ready while the others stay
    ready; Ray Serve replaces the replica whole, whose answers are the one-worker engine's."""
    split = f"{MODEL}-tp2"
    greedy = {"prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0, "logprobs": 2}
    one_worker = http.post("/v1/completions", json={**greedy, "model": MODEL}).json()
    answers: dict[int, httpx.Response] = {}
    no_end = {str(token): -100 for token in reference.tokenizer.all_special_ids}  # runs 200 tokens

    def send(index: int) -> None:
        body = {"model": split, "prompt": f"{index}: {PROMPTS[1]}", "max_tokens": 200,
                "temperature": 0, "logit_bias": no_end}
        answers[index] = httpx.post(f"{base_url}/v1/completions", json=body, timeout=120)

    senders = [threading.Thread(target=send, args=(index,)) for index in range(4)]
    for sender in senders:
        sender.start()
    sent = time.monotonic()
    while replica(split).unfinished_requests.remote().result() == 0:
        assert time.monotonic() - sent < 60, "no request reached the engine"
        time.sleep(0.05)
    (engine_core,) = replica(split).engine_core_pids.remote().result()
    psutil.Process(engine_core).children()[-1].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    for sender in senders:
        sender.join(120)
        assert not sender.is_alive(), "a request hung"
    for answer in answers.values():
        assert answer.status_code in (200, 503), answer.text
        if answer.status_code == 503:
            assert answer.json()["error"]["code"] == "not_ready" and answer.headers["retry-after"]
    health = http.get("/health").json()
    assert health["models"][split] != "ready" and health["models"][MODEL] == "ready"
    # A model scaled to zero while unused: a request waits for the replica Ray Serve starts (as
    # long as an engine of two workers takes to start beside the suite: past the client's 120 s).
    while (answer := http.post("/v1/completions", json={**greedy, "model": split},
                               timeout=RECOVERY_LIMIT_S)).status_code != 200:
        assert answer.status_code == 503 and answer.json()["error"]["code"] in ("not_ready", "overloaded")
        assert time.monotonic() - killed < RECOVERY_LIMIT_S, "never replaced"
        time.sleep(0.5)
    assert_same_answer(answer.json(), one_worker)
    wait_until_healthy(http, killed)
