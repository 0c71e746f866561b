"""Overload: a burst far above a model's bounds gets only correct 200s and enveloped 503s with
Retry-After (never a hang or a bare 5xx), and the service answers correctly right after."""

import gc
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, as_completed

import httpx
import orjson
import psutil
import pytest

from serve_app.ops.local_ray import APP_NAME
from tests.e2e.conftest import FULL_VOCAB_MAX, MODEL, ONE_WINDOW, SMALL_QUEUE, SMALL_QUEUE_MODEL
from tests.e2e.full_vocab_body import ROWS_WRITTEN, StreamedRows
from tests.e2e.test_prefix_reuse import settled_series
from tests.e2e.waiting import poll_until

BURST = 40
BODY = {"model": SMALL_QUEUE_MODEL, "prompt": "The capital of France is", "max_tokens": 96,
        "temperature": 0, "logit_bias": {"4": -100, "0": -100, "1": -100}}
# Requests that hold the model's places for seconds: four choices of 480 tokens.
LONG = {**BODY, "max_tokens": 480, "n": 4}
LIMIT_S = 120


def send(base_url: str, body: dict) -> httpx.Response:
    with httpx.Client(base_url=base_url, timeout=120) as client:
        response = client.post("/v1/completions", json=body)
        response.read()
        return response


def assert_refusal(response: httpx.Response, *causes: str) -> None:
    """A 503 `overloaded` whose message names one of `causes` (by default, the model's queue
    full or waited in too long)."""
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    error = response.json()["error"]
    assert (error["code"], error["type"]) == ("overloaded", "service_unavailable_error")
    causes = causes or ("max_queued_requests", "max_queue_wait_s")
    assert any(cause in error["message"] for cause in causes), error["message"]


def streamed_send(base_url: str, body: dict, placed: threading.Event) -> tuple[int, list[dict], float]:
    """`body` streamed: its status, its events and when it ended (time.monotonic()); `placed`
    is set at its first event, once it is in the model's engine (or at its end)."""
    events = []
    with httpx.Client(base_url=base_url, timeout=LIMIT_S) as client:
        with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    events.append(orjson.loads(line.removeprefix("data: ")))
                    placed.set()
    placed.set()
    return response.status_code, events, time.monotonic()


def holding_places(pool: ThreadPoolExecutor, base_url: str) -> list[Future]:
    """LONG requests in each of the model's places: returned once each is in its engine."""
    placed = [threading.Event() for _ in range(SMALL_QUEUE["max_ongoing_requests"])]
    running = [pool.submit(streamed_send, base_url, LONG, event) for event in placed]
    assert all(event.wait(LIMIT_S) for event in placed), "a long request never reached the engine"
    return running


def finish_reasons(events: list[dict]) -> list[str]:
    """Each choice's finish_reason, by index."""
    reasons = {c["index"]: c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]}
    return [reasons[index] for index in sorted(reasons)]


def service_memory() -> int:
    """Resident bytes of the service: Ray's actors and vLLM's processes on this machine."""
    total = 0
    for process in psutil.process_iter(["cmdline", "memory_info"]):
        title = " ".join(process.info["cmdline"] or [])
        if title.startswith(("ray::", "VLLM::")):
            total += process.info["memory_info"].rss
    return total


def ingress_memory() -> int:
    """Private bytes (RssAnon) of the session app's ingress replicas: what they hold alone."""
    total = 0
    for process in psutil.process_iter(["cmdline"]):
        if f"ServeReplica:{APP_NAME}:Ingress" in " ".join(process.info["cmdline"] or []):
            with open(f"/proc/{process.pid}/status") as status:
                total += next(int(line.split()[1]) * 1024 for line in status if line.startswith("RssAnon:"))
    return total


@pytest.mark.parametrize("stream", [False, True])
def test_a_burst_gets_answers_or_enveloped_refusals(base_url, stream):
    alone = send(base_url, BODY).json()["choices"][0]["text"]
    with ThreadPoolExecutor(max_workers=BURST) as pool:
        responses = list(pool.map(lambda _: send(base_url, {**BODY, "stream": stream}), range(BURST)))
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 503}, statuses
    # At most what runs and waits at once is answered while the burst lasts; the rest is refused.
    assert statuses.count(503) >= BURST - 4 * (SMALL_QUEUE["max_ongoing_requests"] +
                                                SMALL_QUEUE["max_queued_requests"]), statuses
    for response in responses:
        if response.status_code == 503:
            assert_refusal(response)
        elif stream:
            events = [orjson.loads(line[6:]) for line in response.text.split("\n\n")
                      if line.startswith("data: {")]
            assert "".join(e["choices"][0]["text"] for e in events) == alone
        else:
            assert response.json()["choices"][0]["text"] == alone
    assert send(base_url, BODY).json()["choices"][0]["text"] == alone  # right after


def test_a_request_that_waited_past_max_queue_wait_s_is_refused_when_a_place_frees(base_url):
    """Two long requests take the model's two places; two more wait in the ingress's router
    for longer than `max_queue_wait_s`. When the first long one ends, the replica refuses both
    on arrival (each refusal frees the place for the next) instead of serving them."""
    wait_s = SMALL_QUEUE["max_queue_wait_s"]
    with ThreadPoolExecutor(max_workers=4) as pool:
        running = holding_places(pool, base_url)
        sent = time.monotonic()
        waiting = [pool.submit(send, base_url, BODY) for _ in range(2)]
        refused = [future.result() for future in waiting]
        answered = [future.result() for future in running]
    first_place_freed = min(ended for _, _, ended in answered)
    assert first_place_freed - sent > wait_s  # the bound passed while every place was held
    for status, events, _ in answered:
        assert status == 200 and finish_reasons(events) == ["length"] * LONG["n"]
    for response in refused:  # refused, not served, when a place freed
        assert_refusal(response, f"max_queue_wait_s ({wait_s:g} s)")
    assert send(base_url, BODY).status_code == 200  # right after


def test_a_full_vocabulary_request_to_a_full_queue_gets_the_enveloped_refusal(base_url):
    """The model's two places and its two queued ones held by long requests: a full-vocabulary
    request is refused as every other, not with Ray Serve's bare text."""
    full_vocab = {"model": SMALL_QUEUE_MODEL, "prompt": list(range(5, 13)), "max_tokens": 1,
                  "prompt_logprobs": -1}
    queue = SMALL_QUEUE["max_queued_requests"]
    with ThreadPoolExecutor(max_workers=SMALL_QUEUE["max_ongoing_requests"] + 2 * queue) as pool:
        running = holding_places(pool, base_url)
        # Twice what the queue takes: the first to end is a refusal of the full queue, which
        # stays full until a place frees.
        queued = [pool.submit(send, base_url, LONG) for _ in range(2 * queue)]
        assert_refusal(next(as_completed(queued)).result(), "max_queued_requests")
        refused = send(base_url, full_vocab)
        assert all(future.result()[0] == 200 for future in running)
        assert all(future.result().status_code in (200, 503) for future in queued)
    assert_refusal(refused, "max_queued_requests")
    assert len(send(base_url, full_vocab).json()["choices"][0]["prompt_logprobs"]) == 8  # right after


def test_a_full_vocabulary_burst_is_bounded_and_memory_comes_back(base_url):
    """Two run, sixteen wait (config defaults; each waits up to 120 s here), the rest is refused
    at once; afterwards the service holds about what it held before."""
    body = {"model": MODEL, "prompt": list(range(5, 5 + ONE_WINDOW)), "max_tokens": 1,
            "prompt_logprobs": -1}
    send(base_url, body)  # the path warmed up: what stays after it is the idle footprint
    gc.collect()
    idle = service_memory()
    with ThreadPoolExecutor(max_workers=24) as pool:
        responses = list(pool.map(lambda _: send(base_url, body), range(24)))
    statuses = [r.status_code for r in responses]
    refusals = [r.json()["error"]["message"] for r in responses if r.status_code == 503]
    assert set(statuses) <= {200, 503} and statuses.count(200) >= 18, (statuses, refusals)
    for response in responses:
        if response.status_code == 503:
            assert_refusal(response, "full-vocabulary slots")
        else:
            assert len(response.json()["choices"][0]["prompt_logprobs"]) == ONE_WINDOW
    poll_until(lambda: service_memory() <= idle * 1.1, LIMIT_S,
               f"the service's memory back within 10% of {idle / 2**20:.0f} MiB idle", pause_s=0.5)


def test_a_client_that_stops_reading_holds_the_body_back_not_in_the_ingress(base_url, metrics_url,
                                                                           reference):
    """HTTP flow control reaches the relay (each replica runs its code on the loop that serves
    its HTTP): while the client reads nothing, the ingress has a window of pieces written and
    waits. With Serve's own thread for user code, it held all the client had not read. (How it
    goes for a client reading slowly: bench/slow_client.py.)"""
    body = {"model": MODEL, "prompt": list(range(5, 5 + FULL_VOCAB_MAX)), "n": 4, "max_tokens": 1,
            "prompt_logprobs": -1}
    rows = StreamedRows()
    with httpx.Client(base_url=base_url, timeout=LIMIT_S) as client:
        with client.stream("POST", "/v1/completions", json=body,
                           headers={"accept-encoding": "identity"}) as response:
            assert response.status_code == 200, response.read()
            chunks = response.iter_raw()
            rows.feed(next(chunks))
            before = ingress_memory()
            # Once the rows the pool writes stop growing, all that will be written unread is:
            # n = 4 choices of 299 rows of the whole vocabulary are 320 MB of JSON.
            settled_series(metrics_url, ROWS_WRITTEN, MODEL)
            held = ingress_memory() - before
            for chunk in chunks:  # the body goes on as soon as it is read, to its end
                rows.feed(chunk)
    assert held < 64 << 20, held
    positions = body["n"] * (FULL_VOCAB_MAX - 1)
    assert len(rows.rank_ones) == positions
    assert rows.entries == positions * reference.model.config.vocab_size
    assert send(base_url, {**BODY, "model": MODEL}).status_code == 200  # all is well after
