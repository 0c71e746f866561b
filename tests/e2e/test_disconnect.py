"""A client that goes away mid-request frees the engine: its vLLM request is aborted."""

import json
import socket
import time
from urllib.parse import urlsplit

import pytest
from ray import serve

from serve_app.ops.app import model_deployment_name
from serve_app.ops.local_ray import APP_NAME
from tests.e2e.conftest import MAX_MODEL_LEN, MODEL


def unfinished() -> int:
    handle = serve.get_deployment_handle(model_deployment_name(MODEL), app_name=APP_NAME)
    return handle.unfinished_requests.remote().result()


def wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.fixture(scope="module")
def long_generation(http, reference) -> tuple[dict, float]:
    """A request that runs to the context window (end-of-text biased away), and how long it
    takes when its client stays."""
    body = {"model": MODEL, "prompt": "x", "temperature": 0, "max_tokens": MAX_MODEL_LEN - 8,
            "logit_bias": {str(i): -100 for i in reference.tokenizer.all_special_ids}}
    started = time.monotonic()
    assert http.post("/v1/completions", json=body).json()["usage"]["completion_tokens"] == MAX_MODEL_LEN - 8
    return body, time.monotonic() - started


# Plain, streamed, and a full-vocabulary request (its distributions first, then the long
# generation): each kind has its own path through the ingress.
KINDS = {"plain": {}, "streamed": {"stream": True}, "full_vocab": {"prompt_logprobs": -1}}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_client_that_leaves_frees_the_engine(base_url, long_generation, kind):
    body, whole = long_generation
    payload = json.dumps({**body, **KINDS[kind]})
    address = urlsplit(base_url)
    assert wait_for(lambda: unfinished() == 0, 30)
    with socket.create_connection((address.hostname, address.port)) as client:
        client.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {address.netloc}\r\n"
                       f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
                       f"{payload}".encode())
        assert wait_for(lambda: unfinished() == 1, whole / 4)  # the engine is at it
    left = time.monotonic()
    assert wait_for(lambda: unfinished() == 0, whole)
    # Aborted, not finished: the engine let go well before the request's own end.
    assert time.monotonic() - left < whole / 2, (time.monotonic() - left, whole)
