"""Overload: a burst far above a model's bounds gets only correct 200s and enveloped 503s with
Retry-After (never a hang or a bare 5xx), and the service answers correctly right after."""

from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson
import pytest

from tests.e2e.conftest import SMALL_QUEUE, SMALL_QUEUE_MODEL

BURST = 40
BODY = {"model": SMALL_QUEUE_MODEL, "prompt": "The capital of France is", "max_tokens": 96,
        "temperature": 0, "logit_bias": {"4": -100, "0": -100, "1": -100}}


def send(base_url: str, body: dict) -> httpx.Response:
    with httpx.Client(base_url=base_url, timeout=120) as client:
        response = client.post("/v1/completions", json=body)
        response.read()
        return response


def assert_refusal(response: httpx.Response) -> None:
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    error = response.json()["error"]
    assert (error["code"], error["type"]) == ("overloaded", "service_unavailable_error")
    assert "max_queued_requests" in error["message"]


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
