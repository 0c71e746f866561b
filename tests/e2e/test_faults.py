"""The vLLM engine killed mid-request and mid-batch: the request gets an enveloped 503, /health
says that model is not ready while the others stay ready and serving, Ray Serve replaces the
replica, and the model answers correctly again with nobody restarting anything; the batch's
lines in flight get 503 `not_ready` while the replica is replaced, and the runner sends them
again after the wait the refusal names (the model's small queue refuses some lines with 503
`overloaded` all along, retried the same way), so that each is once in the output, answered as
online. One kill for both: a replacement engine takes a minute of these cores."""

import signal
import threading
import time

import httpx
import psutil
from ray import serve

from serve_app.engine.wire import ONLINE
from serve_app.ops.app import model_deployment_name
from serve_app.ops.local_ray import APP_NAME
from tests.e2e.conftest import MAX_MODEL_LEN, MODEL, SMALL_QUEUE, SMALL_QUEUE_MODEL
from tests.e2e.test_batch import (
    assert_answered_as_online,
    finished,
    long_lines,
    results,
    started_batch,
)
from tests.e2e.waiting import poll_until

RECOVERY_LIMIT_S = 240


def replica():
    return serve.get_deployment_handle(model_deployment_name(SMALL_QUEUE_MODEL), app_name=APP_NAME)


def engine_core() -> psutil.Process:
    (pid,) = replica().engine_core_pids.remote().result()
    return psutil.Process(pid)


def the_others_stay_ready_and_serving(http) -> None:
    health = http.get("/health")
    assert health.status_code == 503 and health.json()["error"]["code"] == "not_ready"
    states = health.json()["models"]
    assert states[SMALL_QUEUE_MODEL] != "ready" and states[MODEL] == "ready"
    assert http.get("/health", params={"model": SMALL_QUEUE_MODEL}).status_code == 503
    assert http.get("/health", params={"model": MODEL}).status_code == 200
    assert http.get("/livez").status_code == 200
    other = http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})
    assert other.status_code == 200, other.text


def wait_until_healthy(http, killed: float) -> None:
    """Every model ready again, so that the tests after this one find the whole service."""
    while http.get("/health").status_code != 200:
        assert time.monotonic() - killed < 2 * RECOVERY_LIMIT_S, "answering, yet never healthy"
        time.sleep(0.5)


def test_a_dead_engine_is_replaced_and_its_batch_loses_no_line(base_url, http, client, references, capsys):
    reference = references[SMALL_QUEUE_MODEL]
    greedy = {"model": SMALL_QUEUE_MODEL, "prompt": "The capital of France is", "max_tokens": 4,
              "temperature": 0, "logprobs": 0}
    long = {**greedy, "max_tokens": MAX_MODEL_LEN - 16, "logprobs": None,
            "logit_bias": {str(i): -100 for i in reference.tokenizer.all_special_ids}}
    in_flight = {}
    sender = threading.Thread(target=lambda: in_flight.update(
        response=httpx.post(f"{base_url}/v1/completions", json=long, timeout=120)))
    sender.start()
    sent = time.monotonic()
    while replica().under_way_at.remote(ONLINE).result() == 0:
        assert time.monotonic() - sent < 60, "the long request never reached the engine"
        time.sleep(0.05)
    # The engine stopped where it is, the request in it, while a batch starts on the model: its
    # first line waits in the engine beside the request, the next ones for a place or refused
    # (the model takes two requests at once). Then the engine is killed.
    engine = engine_core()
    engine.send_signal(signal.SIGSTOP)
    bodies = long_lines(400, model=SMALL_QUEUE_MODEL)
    batch_id = started_batch(client, bodies)
    poll_until(lambda: client.batches.retrieve(batch_id).status == "in_progress", 60, "the batch in progress")
    time.sleep(1)  # the runner sends its first lines
    killed = time.monotonic()
    engine.send_signal(signal.SIGKILL)
    sender.join(60)

    response = in_flight["response"]
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "not_ready" and response.headers["retry-after"]
    the_others_stay_ready_and_serving(http)

    while (answer := http.post("/v1/completions", json=greedy)).status_code != 200:
        assert answer.status_code == 503, answer.text  # enveloped, never a hang or a bare 5xx
        assert answer.json()["error"]["code"] in ("not_ready", "overloaded")
        assert time.monotonic() - killed < RECOVERY_LIMIT_S
        time.sleep(0.5)
    recovered = time.monotonic() - killed
    ids = reference.tokenizer.encode(greedy["prompt"])
    assert answer.json()["choices"][0]["logprobs"]["token_ids"] == reference.greedy(ids, 4)

    batch = finished(client, batch_id)
    assert batch.status == "completed", batch
    output, errors = results(client, batch.output_file_id), results(client, batch.error_file_id)
    assert errors == {}
    wait_until_healthy(http, killed)
    with capsys.disabled():
        print(f"\nengine killed: answering again after {recovered:.1f} s, healthy after "
              f"{time.monotonic() - killed:.1f} s")
    # This model takes two requests at once: two prompts a request, none refused.
    assert_answered_as_online(http, output, bodies, SMALL_QUEUE["max_ongoing_requests"])
