"""One real service for the whole session: Ray Serve, the app, vLLM on the tiny model."""

import socket

import httpx
import pytest

from serve_app import local
from serve_app.models import TINY, embedded_model_path
from tests.e2e.reference import Reference

MODEL = TINY
MAX_LOGPROBS = 20
MAX_MODEL_LEN = 512
FULL_VOCAB_MAX = 128
MAX_SCORED = 256
CONFIG = {
    "models": [{
        "name": MODEL,
        "capabilities": {"max_logprobs": MAX_LOGPROBS, "max_model_len": MAX_MODEL_LEN,
                         "full_vocab_max_prompt_tokens": FULL_VOCAB_MAX, "max_scored_tokens": MAX_SCORED},
    }],
    "ingress": {"max_batch_prompts": 8, "max_n": 4},
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def base_url():
    url = local.start(CONFIG, port=free_port(), log_to_driver=False)
    yield url
    local.stop()


@pytest.fixture(scope="session")
def http(base_url):
    with httpx.Client(base_url=base_url, timeout=120) as client:
        yield client


@pytest.fixture(scope="session")
def reference():
    return Reference(embedded_model_path(MODEL))


@pytest.fixture(scope="session")
def complete(http):
    """POSTs a completion request (model filled in) and returns the JSON of a 200."""
    def post(**body):
        response = http.post("/v1/completions", json={"model": MODEL, **body})
        assert response.status_code == 200, response.text
        return response.json()
    return post
