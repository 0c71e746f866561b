"""Label scoring: `logprob_token_ids` gives exactly those ids' log-probabilities, whatever their
rank, at generated positions (vLLM's own) and at scored prompt positions (probserve's vLLM
plugin), on both endpoints; checked against the reference."""

import numpy as np
import pytest

from tests.e2e.conftest import MAX_LABELS, MODEL
from tests.e2e.reference import TOLERANCE
from tests.e2e.sse import stream_events

TEXT = "The capital of France is"
LONGER = "def parse(self, text):\n    return self.decoder.decode(text) if text else None"


def labels_by_rank(reference, row: np.ndarray, ranks: list[int]) -> list[int]:
    """Token ids of these ranks (1-based) in `row`, skipping ids whose texts collide."""
    order, chosen, texts = np.argsort(-row), [], set()
    for rank in ranks:
        for token_id in order[rank - 1:]:
            text = reference.tokenizer.decode([int(token_id)])
            if text not in texts and "\ufffd" not in text and int(token_id) not in chosen:
                chosen.append(int(token_id))
                texts.add(text)
                break
    return chosen


def expected_top(reference, row: np.ndarray, labels: list[int], actual: int) -> dict:
    shown = labels if actual in labels else labels + [actual]
    return {reference.tokenizer.decode([t]): float(row[t]) for t in shown}


def assert_top(got: dict, expected: dict) -> None:
    assert set(got) == set(expected)
    np.testing.assert_allclose([got[t] for t in expected], list(expected.values()), atol=TOLERANCE)


def test_generated_positions_whatever_the_rank(complete, reference):
    ids = reference.tokenizer.encode(TEXT)
    labels = labels_by_rank(reference, reference.log_softmax(ids)[-1], [1, 10, 1000, 3000])
    logprobs = complete(prompt=TEXT, max_tokens=4, temperature=0,
                        logprob_token_ids=labels)["choices"][0]["logprobs"]
    generated = logprobs["token_ids"]
    rows = reference.log_softmax(ids + generated)[len(ids) - 1:-1]
    for row, token_id, top in zip(rows, generated, logprobs["top_logprobs"], strict=True):
        assert_top(top, expected_top(reference, row, labels, token_id))


def test_prompt_positions_with_echo_and_spans(complete, reference):
    ids = reference.tokenizer.encode(LONGER)
    rows = reference.prompt_rows(ids)
    labels = labels_by_rank(reference, rows[5], [2, 500, 2500])
    for fields, start in (({"echo": True}, 1), ({"logprob_start_len": 7}, 7)):
        logprobs = complete(prompt=ids, max_tokens=1, temperature=0, logprob_token_ids=labels,
                            **fields)["choices"][0]["logprobs"]
        for p in range(start, len(ids)):
            at = logprobs["top_logprobs"][p - (0 if "echo" in fields else start)]
            assert_top(at, expected_top(reference, rows[p], labels, ids[p]))


def test_classify_a_batch_by_next_token(complete, reference):
    """Two labels, several texts, one request: the labels' probabilities after each text."""
    texts = [TEXT, "import json", "x = 1"]
    row = reference.log_softmax(reference.tokenizer.encode(texts[0]))[-1]
    labels = labels_by_rank(reference, row, [3, 30])
    body = complete(prompt=texts, max_tokens=1, temperature=0, logprob_token_ids=labels)
    for text, choice in zip(texts, body["choices"], strict=True):
        row = reference.log_softmax(reference.tokenizer.encode(text))[-1]
        top = choice["logprobs"]["top_logprobs"][0]
        for label in labels:
            assert top[reference.tokenizer.decode([label])] == pytest.approx(row[label], abs=TOLERANCE)


def test_chat_lists_the_labels_in_order(http, reference):
    messages = [{"role": "user", "content": "Is Paris in France? Answer yes or no."}]
    ids = list(reference.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                       tokenize=True)["input_ids"])
    row = reference.log_softmax(ids)[-1]
    labels = labels_by_rank(reference, row, [2000, 1, 7])
    response = http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": messages, "max_tokens": 1, "temperature": 0,
        "logprob_token_ids": labels})
    assert response.status_code == 200, response.text
    (entry,) = response.json()["choices"][0]["logprobs"]["content"]
    assert [t["token"] for t in entry["top_logprobs"]] == [reference.tokenizer.decode([t]) for t in labels]
    np.testing.assert_allclose([t["logprob"] for t in entry["top_logprobs"]], row[labels], atol=TOLERANCE)


def test_streamed_generation_reports_labels(http, complete, reference):
    labels = labels_by_rank(reference, reference.log_softmax(reference.tokenizer.encode(TEXT))[-1], [1, 50])
    plain = complete(prompt=TEXT, max_tokens=3, temperature=0, logprob_token_ids=labels)
    chunks = stream_events(http, "/v1/completions", {
        "model": MODEL, "prompt": TEXT, "max_tokens": 3, "temperature": 0,
        "logprob_token_ids": labels, "stream": True})
    streamed = [top for c in chunks for top in c["choices"][0]["logprobs"]["top_logprobs"]]
    expected = plain["choices"][0]["logprobs"]["top_logprobs"]
    assert len(expected) == 3
    for got, want in zip(streamed, expected, strict=True):
        assert_top(got, want)


@pytest.mark.parametrize("fields, param, code", [
    ({"logprob_token_ids": list(range(MAX_LABELS + 1))}, "logprob_token_ids", "invalid_request"),
    ({"logprob_token_ids": []}, "logprob_token_ids", "invalid_request"),
    ({"logprob_token_ids": [5], "logprobs": 2}, "logprobs", "invalid_combination"),
    ({"logprob_token_ids": [5], "prompt_logprobs": 1}, "prompt_logprobs", "invalid_combination"),
    ({"logprob_token_ids": [5, -1]}, "logprob_token_ids", "invalid_request"),
])
def test_refusals(http, fields, param, code):
    response = http.post("/v1/completions", json={"model": MODEL, "prompt": TEXT, **fields})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, code)
