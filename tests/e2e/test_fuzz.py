"""Property-based fuzzing of POST /v1/completions and /v1/chat/completions over HTTP: random,
mutated and malformed bodies never get a 5xx, every 4xx carries the error envelope with a
documented code, and the service answers correctly afterwards."""

import collections
import json

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.conftest import MODEL
from tests.e2e.test_errors import documented_codes

FIELDS = ["model", "prompt", "max_tokens", "temperature", "top_p", "n", "seed", "stop",
          "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "echo",
          "prompt_logprobs", "logprob_start_len", "stream", "stream_options", "best_of", "suffix",
          "user", "prompt_logprob", "top_logprobs", "max_token", "messages", "logprob_token_ids",
          "max_completion_tokens"]
BASE = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 2}
CHAT_BASE = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
STATS = {"requests": 0, "statuses": collections.Counter(), "codes": collections.Counter()}
FUZZ = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats()
           | st.text(max_size=12) | st.sampled_from([-1, 0, 1, 2, 100, 101, 4095, 4096, 2**63]))
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12)
near_valid = {
    "prompt": st.text(max_size=40) | st.lists(st.integers(-5, 5000), max_size=20)
    | st.lists(st.text(max_size=10) | st.lists(st.integers(0, 4100), max_size=6), max_size=10),
    "max_tokens": st.integers(-2, 40),
    "n": st.integers(-1, 6),
    "logprobs": st.integers(-2, 22),
    "prompt_logprobs": st.integers(-3, 22),
    "logprob_start_len": st.integers(-1, 30),
    "temperature": st.floats(-1, 3) | st.sampled_from([0.0, 1e-9, 1e-5]),
    "top_p": st.floats(-0.5, 1.5),
    "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=6),
    "logit_bias": st.dictionaries(st.text("0123456789-x", max_size=5), st.floats(-200, 200), max_size=3),
    "echo": st.booleans(), "stream": st.booleans(),
    "seed": st.integers(-3, 2**64),
    "logprob_token_ids": st.lists(st.integers(-2, 4100), max_size=20),
}
near_valid_chat = {
    **{field: near_valid[field] for field in near_valid if field not in ("prompt", "echo",
                                                                         "prompt_logprobs",
                                                                         "logprob_start_len")},
    "messages": st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", ""]),
         "content": st.text(max_size=20) | st.lists(st.fixed_dictionaries(
             {"type": st.sampled_from(["text", "image_url"]), "text": st.text(max_size=8)}),
             max_size=2)}), max_size=3),
    "logprobs": st.booleans() | st.integers(0, 2),
    "top_logprobs": st.integers(-2, 22),
    "max_completion_tokens": st.integers(-1, 40),
}
mutations = st.lists(
    st.tuples(st.sampled_from(FIELDS), st.sampled_from(["set", "near", "delete"]), json_values),
    min_size=1, max_size=4)


def mutate(base: dict, steps) -> dict:
    body = dict(base)
    for field, action, value in steps:
        if action == "delete":
            body.pop(field, None)
        else:
            body[field] = value
    return body


@st.composite
def mutated_bodies(draw, base: dict, fields: dict) -> dict:
    """Near-valid bodies (each field pushed around its limits), half of them also mutated."""
    body = mutate(base, draw(mutations)) if draw(st.booleans()) else dict(base)
    for field in draw(st.lists(st.sampled_from(sorted(fields)), min_size=1, max_size=4)):
        body[field] = draw(fields[field])
    return body


def encode(body) -> bytes:
    """The stdlib writes what orjson will not: integers past 64 bits, NaN and Infinity."""
    return json.dumps(body).encode()


def send(http, content: bytes, content_type: str | None = "application/json",
         path: str = COMPLETIONS):
    headers = {"content-type": content_type} if content_type else {}
    with http.stream("POST", path, content=content, headers=headers) as response:
        payload = b"".join(response.iter_bytes())
    STATS["requests"] += 1
    STATS["statuses"][response.status_code] += 1
    assert response.status_code < 500, payload[:300]
    if response.status_code >= 400:
        error = orjson.loads(payload)["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert error["code"] in documented_codes() and error["message"]
        STATS["codes"][error["code"]] += 1
    elif response.headers["content-type"].startswith("text/event-stream"):
        assert b"internal_error" not in payload and payload.endswith(b"data: [DONE]\n\n")
    else:
        assert orjson.loads(payload)["object"] in ("text_completion", "chat.completion")


def fuzz(strategy, check) -> int:
    """Runs `check` on FUZZ's examples of `strategy`; returns how many ran."""
    ran = []

    @FUZZ
    @given(example=strategy)
    def run(example):
        ran.append(1)
        check(example)

    run()
    return len(ran)


def assert_still_correct(http, reference, capsys) -> None:
    ids = reference.tokenizer.encode(BASE["prompt"])
    response = http.post(COMPLETIONS, json={"model": MODEL, "prompt": ids, "max_tokens": 4,
                                            "temperature": 0, "logprobs": 0})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["logprobs"]["token_ids"] == reference.greedy(ids, 4)
    with capsys.disabled():
        print(f"\nfuzzing so far: {STATS['requests']} requests, statuses {dict(STATS['statuses'])}, "
              f"codes {dict(sorted(STATS['codes'].items()))}")


@pytest.mark.parametrize("path, base, fields", [(COMPLETIONS, BASE, near_valid),
                                                (CHAT, CHAT_BASE, near_valid_chat)])
def test_mutated_bodies(http, reference, capsys, path, base, fields):
    ran = fuzz(mutated_bodies(base, fields), lambda body: send(http, encode(body), path=path))
    assert ran == FUZZ.max_examples
    assert_still_correct(http, reference, capsys)


@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_random_json(http, reference, capsys, path):
    assert fuzz(json_values, lambda body: send(http, encode(body), path=path)) > 0
    assert_still_correct(http, reference, capsys)


def test_malformed_bodies(http, reference, capsys):
    content_types = st.sampled_from([None, "application/json", "application/json; charset=utf-8",
                                     "text/plain", "multipart/form-data", ""])
    contents = st.binary(max_size=64) | st.text(max_size=64).map(str.encode)
    ran = fuzz(st.tuples(contents, content_types), lambda pair: send(http, *pair))
    assert ran == FUZZ.max_examples
    assert_still_correct(http, reference, capsys)
