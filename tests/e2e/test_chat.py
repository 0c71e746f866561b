"""POST /v1/chat/completions end to end: the prompt is the model's chat template token for
token, logprobs match the reference, streams add up, and /v1/completions' rules hold here too."""

import numpy as np
import pytest
from openai import OpenAI

from tests.e2e.conftest import FAMILIES, MAX_LOGPROBS, MAX_MODEL_LEN, MODEL, SERVED_ADAPTERS, SPLIT_MODELS
from tests.e2e.reference import TOLERANCE, assert_top_texts
from tests.e2e.sse import stream_events

MESSAGES = [{"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "What is the capital of France?"}]


def chat(http, status: int = 200, **fields) -> dict:
    response = http.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, **fields})
    assert response.status_code == status, response.text
    return response.json()


def template_ids(reference, messages=MESSAGES) -> list[int]:
    return list(reference.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                        tokenize=True)["input_ids"])


def test_the_prompt_is_the_chat_template(http, reference):
    ids = template_ids(reference)
    tokenized = http.post("/tokenize", json={"model": MODEL, "messages": MESSAGES}).json()
    assert tokenized["tokens"] == ids
    assert chat(http, max_tokens=1)["usage"]["prompt_tokens"] == len(ids)


@pytest.mark.parametrize("top", [0, 3, MAX_LOGPROBS])
def test_logprobs_of_generated_tokens_match_the_reference(http, reference, top):
    ids = template_ids(reference)
    body = chat(http, max_tokens=6, temperature=0, logprobs=True, top_logprobs=top)
    (choice,) = body["choices"]
    entries = choice["logprobs"]["content"]
    generated = reference.greedy(ids, 6)  # no end token in the template's greedy run
    assert choice["message"] == {"role": "assistant", "content": reference.tokenizer.decode(
        generated, skip_special_tokens=True)}
    rows = reference.log_softmax(ids + generated)[len(ids) - 1:-1]
    for row, token_id, entry in zip(rows, generated, entries, strict=True):
        assert entry["logprob"] == pytest.approx(row[token_id], abs=TOLERANCE)
        # Exactly the top k, likeliest first, each logprob bound to its token.
        listed = entry["top_logprobs"]
        assert len(listed) == top
        values = [e["logprob"] for e in listed]
        assert values == sorted(values, reverse=True)
        assert_top_texts({e["token"]: e["logprob"] for e in listed}, reference.tokenizer, row, top, None)
    assert body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": len(entries),
                             "total_tokens": len(ids) + len(entries)}
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")


def test_top_logprobs_turns_logprobs_on(http):
    assert chat(http, max_tokens=2, top_logprobs=2)["choices"][0]["logprobs"] is not None
    assert chat(http, max_tokens=2)["choices"][0]["logprobs"] is None


def test_max_completion_tokens_and_n(http):
    body = chat(http, max_completion_tokens=3, n=2, temperature=1.0, seed=4)
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"]["completion_tokens"] <= 6
    assert all(c["finish_reason"] in ("length", "stop") for c in body["choices"])


def test_seed_and_stop(http):
    runs = [chat(http, max_tokens=8, seed=5)["choices"][0]["message"]["content"] for _ in range(2)]
    assert runs[0] == runs[1]
    full = chat(http, max_tokens=12, temperature=0)["choices"][0]["message"]["content"]
    stop = full[len(full) // 2:][:2]
    stopped = chat(http, max_tokens=12, temperature=0, stop=stop)["choices"][0]
    assert stopped["finish_reason"] == "stop" and stopped["message"]["content"] == full[:full.index(stop)]


def events(http, **fields) -> list[dict]:
    return stream_events(http, "/v1/chat/completions",
                         {"model": MODEL, "messages": MESSAGES, "stream": True, **fields})


def test_a_stream_adds_up_to_the_plain_answer(http):
    plain = chat(http, max_tokens=10, temperature=0, logprobs=True, top_logprobs=2)
    chunks = events(http, max_tokens=10, temperature=0, logprobs=True, top_logprobs=2,
                    stream_options={"include_usage": True})
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert choices[0]["delta"]["role"] == "assistant"
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    (expected,) = plain["choices"]
    assert "".join(c["delta"]["content"] for c in choices) == expected["message"]["content"]
    assert choices[-1]["finish_reason"] == expected["finish_reason"]
    streamed = [e for c in choices if c["logprobs"] for e in c["logprobs"]["content"]]
    assert [e["token"] for e in streamed] == [e["token"] for e in expected["logprobs"]["content"]]
    assert [e["bytes"] for e in streamed] == [e["bytes"] for e in expected["logprobs"]["content"]]
    np.testing.assert_allclose([e["logprob"] for e in streamed],
                               [e["logprob"] for e in expected["logprobs"]["content"]], atol=TOLERANCE)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == plain["usage"]


def test_the_openai_sdk(base_url, reference):
    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused")
    response = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4,
                                              temperature=0, logprobs=True, top_logprobs=2)
    choice = response.choices[0]
    assert len(choice.logprobs.content) == response.usage.completion_tokens
    parts = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4,
                                           temperature=0, stream=True)
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == choice.message.content


def test_content_as_text_parts(http):
    parts = [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]} for m in MESSAGES]
    as_parts = http.post("/v1/chat/completions", json={"model": MODEL, "messages": parts,
                                                       "max_tokens": 4, "temperature": 0}).json()
    plain = chat(http, max_tokens=4, temperature=0)
    assert as_parts["choices"][0]["message"] == plain["choices"][0]["message"]


def test_models_say_which_serve_chat(http):
    cards = {card["id"]: card["chat"] for card in http.get("/v1/models").json()["data"]}
    assert cards == {"tiny-llama": True, "tiny-llama3": True, "tiny-sentencepiece": False,
                     "tiny-llama-sibling": True, "smollm2-135m-instruct": True,
                     **dict.fromkeys(SPLIT_MODELS, True),  # tiny-llama's tokenizer
                     **{a["name"]: cards[name] for name in FAMILIES for a in SERVED_ADAPTERS[name]}}


def test_a_model_without_a_template_says_so(http):
    response = http.post("/v1/chat/completions", json={"model": "tiny-sentencepiece", "messages": MESSAGES})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("no_chat_template", "model")
    assert "chat template" in error["message"]


# The rules of the fields both endpoints share, broken the same way on each.
SHARED_VIOLATIONS = [
    ("max_tokens", True, "max_tokens", "invalid_request"),
    ("max_tokens", 0, "max_tokens", "invalid_request"),
    ("temperature", True, "temperature", "invalid_request"),
    ("temperature", 2.5, "temperature", "invalid_request"),
    ("top_p", 0, "top_p", "invalid_request"),
    ("n", 5, "n", "invalid_request"),
    ("n", 1.0, "n", "invalid_request"),
    ("seed", -1, "seed", "invalid_request"),
    ("stop", ["a"] * 5, "stop", "invalid_request"),
    ("presence_penalty", 3, "presence_penalty", "invalid_request"),
    ("logit_bias", {"x": 1}, "logit_bias", "invalid_token_id"),
    ("logit_bias", {"5": 101}, "logit_bias", "invalid_request"),
    ("logprob_token_ids", [10**6], "logprob_token_ids", "invalid_token_id"),
    ("logprob_token_ids", [1, 1], "logprob_token_ids", "invalid_request"),
    ("stream_options", {"include_usage": True}, "stream_options", "invalid_combination"),
    ("stream", 1, "stream", "invalid_request"),
    ("max_tokens", MAX_MODEL_LEN, "max_tokens", "context_length_exceeded"),
    ("model", "nope", "model", "model_not_found"),
    ("usr", "x", "usr", "unknown_field"),
]


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("field, value, param, code", SHARED_VIOLATIONS)
def test_shared_rules_hold_on_both_endpoints(http, endpoint, field, value, param, code):
    base = {"prompt": "x"} if endpoint == "/v1/completions" else {"messages": MESSAGES}
    response = http.post(endpoint, json={"model": MODEL, **base, field: value})
    assert response.status_code == (404 if code == "model_not_found" else 400), response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, code)


@pytest.mark.parametrize("fields, param, code", [
    ({"logprobs": 1}, "logprobs", "invalid_request"),
    ({"top_logprobs": True}, "top_logprobs", "invalid_request"),
    ({"top_logprobs": MAX_LOGPROBS + 1}, "top_logprobs", "invalid_request"),
    ({"max_completion_tokens": 0}, "max_completion_tokens", "invalid_request"),
    ({"max_completion_tokens": MAX_MODEL_LEN}, "max_completion_tokens", "context_length_exceeded"),
    ({"max_tokens": 3, "max_completion_tokens": 4}, "max_completion_tokens", "invalid_combination"),
    ({"logprob_token_ids": [5], "top_logprobs": 2}, "top_logprobs", "invalid_combination"),
    ({"messages": []}, "messages", "invalid_request"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages", "invalid_request"),
    ({"messages": [{"role": "user"}]}, "messages", "invalid_request"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages", "unknown_field"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "u"}]}]},
     "messages", "invalid_request"),
    ({"prompt_logprobs": True}, "prompt_logprobs", "invalid_request"),
    ({"score_final_message": 1}, "score_final_message", "invalid_request"),
    ({"echo": True, "max_tokens": 1, "best_of": 1}, "best_of", "unknown_field"),
])
def test_chat_rules(http, fields, param, code):
    response = http.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, **fields})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, code)
