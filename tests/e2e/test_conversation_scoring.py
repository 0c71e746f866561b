"""Conversations scored on /v1/chat/completions: the final message's tokens
(`score_final_message`), the prompt's (`prompt_logprobs`, `echo`, `logprob_start_len`) and its
whole distributions (`prompt_logprobs: -1`), on the chat templates of three families (ChatML
without BOS, Llama 3's, which trims each message, and SmolLM2's own), checked against the float32
reference and against /tokenize + /v1/completions on the same ids."""

import gzip
import io
import math

import numpy as np
import orjson
import pytest

from serve_app.store.model_store import SMOLLM2, TINY, TINY_BOS, TINY_SENTENCEPIECE, embedded_model_path
from tests.e2e.conftest import MODEL
from tests.e2e.reference import TOLERANCE, Reference, assert_rank, assert_top_texts

REPLY = " The capital of France is Paris, of course. "
CONVERSATION = [{"role": "system", "content": "You answer briefly."},
                {"role": "user", "content": "What is the capital of France?"},
                {"role": "assistant", "content": REPLY}]
TEMPLATED = [TINY, TINY_BOS, SMOLLM2]
TOP = 3


@pytest.fixture(scope="module")
def chat_references(references):
    return {TINY: references[TINY], TINY_BOS: references[TINY_BOS],
            SMOLLM2: Reference(embedded_model_path(SMOLLM2))}


def post(http, path: str, status: int = 200, **body) -> dict:
    response = http.post(path, json=body)
    assert response.status_code == status, response.text
    return response.json()


def span_of(ids: list[int], part: list[int]) -> int:
    """Where `part` stands in `ids`: exactly once."""
    starts = [i for i in range(len(ids) - len(part) + 1) if ids[i:i + len(part)] == part]
    assert len(starts) == 1, starts
    return starts[0]


@pytest.mark.parametrize("family", TEMPLATED)
def test_the_final_reply_is_scored_as_the_reference_and_completions_score_it(http, chat_references, family):
    reference = chat_references[family]
    body = post(http, "/v1/chat/completions", model=family, messages=CONVERSATION, max_tokens=1,
                score_final_message=True, top_logprobs=TOP)
    ids = post(http, "/tokenize", model=family, messages=CONVERSATION)["tokens"]
    assert ids == list(reference.tokenizer.apply_chat_template(CONVERSATION, add_generation_prompt=True)
                       ["input_ids"])
    final = body["final_message_logprobs"]
    tokens = final["content"]
    scored = [t["token_id"] for t in tokens]
    start = span_of(ids, scored)
    # The pieces join into the reply as the template writes it (Llama 3's trims it), each
    # piece the reply's text at its offset.
    written = "".join(t["token"] for t in tokens)
    assert written == (REPLY.strip() if family == TINY_BOS else REPLY)
    for token in tokens:
        assert REPLY[token["text_offset"]:token["text_offset"] + len(token["token"])] == token["token"]
        assert token["bytes"] == list(token["token"].encode())
    # Exactly the reply's tokens: all of its text, and no token that could be left out.
    decode = reference.tokenizer.decode
    assert written in decode(scored)
    assert written not in decode(scored[1:]) and written not in decode(scored[:-1])
    rows = reference.prompt_rows(ids)
    for position, token in enumerate(tokens, start):
        row = rows[position]
        assert token["logprob"] == pytest.approx(row[token["token_id"]], abs=TOLERANCE)
        assert_rank(row, token["token_id"], token["rank"])
        assert len(token["top_logprobs"]) == TOP
        assert_top_texts({e["token"]: e["logprob"] for e in token["top_logprobs"]}, reference.tokenizer,
                         row, TOP, None)
    assert final["logprob_sum"] == pytest.approx(math.fsum(t["logprob"] for t in tokens), abs=1e-9)
    assert final["role"] == "assistant"
    # The same ids through /v1/completions, scored from the reply's first token.
    completion = post(http, "/v1/completions", model=family, prompt=ids, max_tokens=1, logprobs=TOP,
                      logprob_start_len=start)["choices"][0]["logprobs"]
    count = len(tokens)
    assert completion["token_ids"][:count] == scored
    assert completion["token_logprobs"][:count] == pytest.approx([t["logprob"] for t in tokens], abs=1e-6)
    for listed, token in zip(completion["top_logprobs"][:count], tokens, strict=True):
        assert set(listed) >= {e["token"] for e in token["top_logprobs"]}


def test_prompt_logprobs_of_a_span_are_completions_rows(http, reference):
    ids = post(http, "/tokenize", model=MODEL, messages=CONVERSATION)["tokens"]
    start = len(ids) // 2
    body = post(http, "/v1/chat/completions", model=MODEL, messages=CONVERSATION, max_tokens=1,
                prompt_logprobs=2, logprob_start_len=start)
    rows = body["prompt_logprobs"]
    assert len(rows) == len(ids) and rows[:start] == [None] * start
    completion = post(http, "/v1/completions", model=MODEL, prompt=ids, max_tokens=1, prompt_logprobs=2)
    expected = completion["choices"][0]["prompt_logprobs"]
    reference_rows = reference.prompt_rows(ids)
    for position in range(start, len(ids)):
        row = rows[position]
        assert list(row) == list(expected[position])  # the prompt token first, then the top 2
        assert next(iter(row)) == str(ids[position])
        for token_id, entry in row.items():
            assert entry["logprob"] == pytest.approx(expected[position][token_id]["logprob"], abs=1e-6)
            assert entry["logprob"] == pytest.approx(reference_rows[position][int(token_id)], abs=TOLERANCE)


def test_echo_scores_the_prompt_and_continues_the_final_message(http, reference):
    """vLLM's echo: the prompt scored at the top_logprobs width, and an answer that continues
    the final message starts with its text."""
    expected_ids = list(reference.tokenizer.apply_chat_template(
        CONVERSATION, continue_final_message=True)["input_ids"])
    tokenized = post(http, "/tokenize", model=MODEL, messages=CONVERSATION, continue_final_message=True)
    assert tokenized["tokens"] == expected_ids
    body = post(http, "/v1/chat/completions", model=MODEL, messages=CONVERSATION, max_tokens=2,
                temperature=0, echo=True, top_logprobs=1, continue_final_message=True)
    (choice,) = body["choices"]
    generated = reference.greedy(expected_ids, 2)
    continued = REPLY + reference.tokenizer.decode(generated, skip_special_tokens=True)
    assert choice["message"] == {"role": "assistant", "content": continued}
    rows = body["prompt_logprobs"]
    assert body["usage"]["prompt_tokens"] == len(rows) == len(expected_ids) and rows[0] is None
    reference_rows = reference.prompt_rows(expected_ids)
    for position, row in enumerate(rows[1:], 1):
        assert len(row) in (1, 2)  # the prompt token, and the top 1 unless it is the top 1
        token_id = expected_ids[position]
        expected = reference_rows[position][token_id]
        assert row[str(token_id)]["logprob"] == pytest.approx(expected, abs=TOLERANCE)


def test_the_full_vocabulary_of_a_conversation(http, reference):
    ids = post(http, "/tokenize", model=MODEL, messages=CONVERSATION)["tokens"]
    request = {"model": MODEL, "messages": CONVERSATION, "max_tokens": 1, "prompt_logprobs": -1,
               "score_final_message": True, "top_logprobs": 2}
    with http.stream("POST", "/v1/chat/completions", json=request,
                     headers={"accept-encoding": "gzip"}) as response:
        raw = b"".join(response.iter_raw())
    assert response.status_code == 200, raw[:300]
    body = orjson.loads(gzip.decompress(raw))
    rows, expected = body["prompt_logprobs"], reference.prompt_rows(ids)
    assert len(rows) == len(ids) and rows[0] is None
    for position in (1, len(ids) // 2, len(ids) - 1):
        entries = rows[position]
        assert len(entries) == expected.shape[1] and next(iter(entries)) == str(ids[position])
        token_ids = np.array([int(t) for t in entries])
        np.testing.assert_allclose([e["logprob"] for e in entries.values()], expected[position][token_ids],
                                   atol=TOLERANCE)
    # The final message's scores come along, as the top-k path gives them.
    top_k = post(http, "/v1/chat/completions", **{**request, "prompt_logprobs": None})
    assert [t["token_id"] for t in body["final_message_logprobs"]["content"]] == \
        [t["token_id"] for t in top_k["final_message_logprobs"]["content"]]
    assert body["final_message_logprobs"]["logprob_sum"] == pytest.approx(
        top_k["final_message_logprobs"]["logprob_sum"], abs=1e-4)
    assert body["object"] == "chat.completion" and len(body["choices"]) == 1


def test_the_full_vocabulary_of_a_conversation_as_npy(http, reference):
    """The binary form, as on /v1/completions: a record per position, in token-id order."""
    ids = post(http, "/tokenize", model=MODEL, messages=CONVERSATION)["tokens"]
    request = {"model": MODEL, "messages": CONVERSATION, "max_tokens": 1, "prompt_logprobs": -1}
    with http.stream("POST", "/v1/chat/completions", json=request,
                     headers={"accept": "application/x-npy"}) as response:
        raw = b"".join(response.iter_raw())
    assert response.status_code == 200, raw[:300]
    assert response.headers["content-type"] == "application/x-npy"
    records = np.load(io.BytesIO(raw))
    assert records["token_id"].tolist() == ids and records["position"].tolist() == list(range(len(ids)))
    assert np.isnan(records["logprobs"][0]).all()
    np.testing.assert_allclose(records["logprobs"][1:], reference.prompt_rows(ids)[1:], atol=TOLERANCE)


@pytest.mark.parametrize("fields, status, param, code", [
    ({"stream": True, "score_final_message": True}, 400, "stream", "invalid_combination"),
    ({"stream": True, "prompt_logprobs": 1}, 400, "stream", "invalid_combination"),
    ({"continue_final_message": True, "add_generation_prompt": True}, 400, "continue_final_message",
     "invalid_combination"),
    ({"chat_template_kwargs": {"add_generation_prompt": False}}, 400, "chat_template_kwargs",
     "invalid_chat_template_kwargs"),
    ({"prompt_logprobs": -1, "logprob_start_len": 1}, 400, "logprob_start_len", "invalid_combination"),
    ({"model": TINY_SENTENCEPIECE, "score_final_message": True}, 400, "model", "no_chat_template"),
])
def test_refusals(http, fields, status, param, code):
    body = {"model": MODEL, "messages": CONVERSATION, "max_tokens": 1, **fields}
    error = post(http, "/v1/chat/completions", status, **body)["error"]
    assert (error["param"], error["code"]) == (param, code)
