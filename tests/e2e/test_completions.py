"""/v1/completions end to end, every number checked against a float32 forward pass."""

import numpy as np
import pytest

from serve_app.config import Capabilities
from serve_app.store.model_store import SMOLLM2, TINY_SIBLING
from tests.e2e.conftest import (
    CAPABILITIES,
    FAMILIES,
    MAX_LOGPROBS,
    MAX_MODEL_LEN,
    MODEL,
    SERVED_ADAPTERS,
    SPLIT_MODELS,
)
from tests.e2e.reference import TOLERANCE, assert_rank, assert_top_k, assert_top_texts
from tests.e2e.text_pieces import assert_pieces, special_tokens

TEXT = "The capital of France is"
LONGER = "def parse(self, text):\n    return self.decoder.decode(text) if text else None"


def test_models_reports_the_capabilities_validation_enforces(http):
    body = http.get("/v1/models").json()
    assert body["object"] == "list"
    adapters = {name: [adapter["name"] for adapter in SERVED_ADAPTERS[name]] for name in FAMILIES}
    with_adapters = [served for name in FAMILIES for served in (name, *adapters[name])]
    assert [card["id"] for card in body["data"]] == with_adapters + [TINY_SIBLING, *SPLIT_MODELS, SMOLLM2]
    parents = {adapter: name for name in FAMILIES for adapter in adapters[name]}
    for card in body["data"][:-1]:
        assert card["object"] == "model" and card["parent"] == parents.get(card["id"])
        assert card["capabilities"] == CAPABILITIES
    assert body["data"][-1]["capabilities"] == Capabilities().model_dump()  # the defaults


def test_health(http):
    answer = http.get("/health").json()
    states = answer["models"]
    assert answer["status"] == "ok" and {states[m] for m in states if m not in SPLIT_MODELS} == {"ready"}
    assert all(states[split] in ("ready", "scaled to zero") for split in SPLIT_MODELS)
    assert MODEL in answer["models"]
    assert http.get("/health", params={"model": MODEL}).json() == {"status": "ok",
                                                                    "models": {MODEL: "ready"}}
    unknown = http.get("/health", params={"model": "no-such-model"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert http.get("/livez").json() == {"status": "ok"}


@pytest.mark.parametrize("form", ["string", "token ids"])
def test_greedy_tokens_match_the_reference(complete, reference, form):
    ids = reference.tokenizer.encode(LONGER)
    prompt = LONGER if form == "string" else ids
    body = complete(prompt=prompt, max_tokens=6, temperature=0, logprobs=0)
    (choice,) = body["choices"]
    generated = choice["logprobs"]["token_ids"]
    assert generated == reference.greedy(ids, 6)  # the prompt's greedy run has no end token
    assert body["usage"]["prompt_tokens"] == len(ids)
    assert body["usage"]["completion_tokens"] == len(generated)
    assert choice["text"] == reference.tokenizer.decode(generated, skip_special_tokens=True)


def test_batches_give_one_choice_per_prompt(complete, reference):
    prompts = [TEXT, LONGER, "x = 1"]
    body = complete(prompt=prompts, max_tokens=2, temperature=0, logprobs=0)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    for prompt, choice in zip(prompts, body["choices"], strict=True):
        ids = reference.tokenizer.encode(prompt)
        assert choice["logprobs"]["token_ids"] == reference.greedy(ids, 2)
    ids_batch = [reference.tokenizer.encode(p) for p in prompts]
    assert complete(prompt=ids_batch, max_tokens=2, temperature=0)["choices"][2]["text"] == \
        body["choices"][2]["text"]
    assert body["usage"]["prompt_tokens"] == sum(len(i) for i in ids_batch)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_n_choices_per_prompt(complete, temperature):
    body = complete(prompt=[TEXT, LONGER], max_tokens=3, n=2, seed=5, temperature=temperature,
                    logprobs=0)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert body["usage"]["completion_tokens"] == sum(
        len(c["logprobs"]["tokens"]) for c in body["choices"])
    if temperature == 0:
        assert body["choices"][0]["text"] == body["choices"][1]["text"]


def test_seed_makes_sampling_reproducible(complete):
    runs = [complete(prompt=TEXT, max_tokens=8, temperature=1.0, seed=seed)["choices"][0]["text"]
            for seed in (11, 11, 12, 13)]
    assert runs[0] == runs[1]
    assert len(set(runs[1:])) > 1


def test_top_p_near_zero_is_greedy(complete):
    greedy = complete(prompt=TEXT, max_tokens=5, temperature=0)["choices"][0]["text"]
    narrow = complete(prompt=TEXT, max_tokens=5, temperature=1.0, top_p=1e-6, seed=3)
    assert narrow["choices"][0]["text"] == greedy


def test_max_tokens_bounds_the_completion(complete):
    choice = complete(prompt=LONGER, max_tokens=4, temperature=0, logprobs=0)["choices"][0]
    tokens = len(choice["logprobs"]["tokens"])
    assert tokens <= 4
    assert choice["finish_reason"] == ("length" if tokens == 4 else "stop")


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
def test_max_tokens_omitted_generates_to_the_context_window(http, reference, endpoint):
    """End-of-text tokens are biased away, so only the window can stop the generation."""
    specials = {str(i): -100 for i in reference.tokenizer.all_special_ids}
    prompt = ({"prompt": TEXT} if endpoint == "/v1/completions"
              else {"messages": [{"role": "user", "content": TEXT}]})
    response = http.post(endpoint, json={"model": MODEL, **prompt, "temperature": 0,
                                         "logit_bias": specials})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["total_tokens"] == MAX_MODEL_LEN


def test_stop_string_ends_the_text(complete):
    full = complete(prompt=LONGER, max_tokens=12, temperature=0)["choices"][0]["text"]
    stop = full[len(full) // 2:len(full) // 2 + 2]
    assert len(stop) == 2
    stopped = complete(prompt=LONGER, max_tokens=12, temperature=0, stop=[stop])["choices"][0]
    assert stopped["finish_reason"] == "stop"
    assert stopped["text"] == full[:full.index(stop)]


@pytest.mark.parametrize("k", [0, 1, 5, MAX_LOGPROBS])
def test_logprobs_k_of_generated_tokens(complete, reference, k):
    ids = reference.tokenizer.encode(TEXT)
    choice = complete(prompt=TEXT, max_tokens=4, temperature=0, logprobs=k)["choices"][0]
    logprobs = choice["logprobs"]
    generated = logprobs["token_ids"]
    assert generated == reference.greedy(ids, 4)
    rows = reference.log_softmax(ids + generated)[len(ids) - 1:-1]
    for row, token_id, logprob, top in zip(rows, generated, logprobs["token_logprobs"],
                                           logprobs["top_logprobs"], strict=True):
        assert logprob == pytest.approx(row[token_id], abs=TOLERANCE)
        assert_top_texts(top, reference.tokenizer, row, k, token_id)
    assert_pieces(choice["text"], logprobs["tokens"], logprobs["text_offset"], generated,
                  *special_tokens(reference.tokenizer))


def test_echo_returns_and_scores_the_prompt(complete, reference):
    ids = reference.tokenizer.encode(LONGER)
    rows = reference.prompt_rows(ids)
    choice = complete(prompt=LONGER, max_tokens=1, temperature=0, echo=True, logprobs=3)["choices"][0]
    assert choice["text"].startswith(LONGER)
    logprobs = choice["logprobs"]
    assert logprobs["token_ids"][:len(ids)] == ids
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    for p in range(1, len(ids)):
        assert logprobs["token_logprobs"][p] == pytest.approx(rows[p][ids[p]], abs=TOLERANCE)
        assert_top_texts(logprobs["top_logprobs"][p], reference.tokenizer, rows[p], 3, ids[p])
    assert_pieces(choice["text"], logprobs["tokens"], logprobs["text_offset"],
                  logprobs["token_ids"], *special_tokens(reference.tokenizer))


def test_echo_without_logprobs(complete):
    choice = complete(prompt=TEXT, max_tokens=2, echo=True, temperature=0)["choices"][0]
    assert choice["text"].startswith(TEXT) and choice["logprobs"] is None


@pytest.mark.parametrize("k", [0, 1, 5])
def test_prompt_logprobs_top_k_and_true_ranks(complete, reference, k):
    ids = reference.tokenizer.encode(LONGER)
    rows = reference.prompt_rows(ids)
    choice = complete(prompt=LONGER, max_tokens=1, prompt_logprobs=k)["choices"][0]
    positions = choice["prompt_logprobs"]
    assert len(positions) == len(ids) and positions[0] is None
    for p in range(1, len(ids)):
        entries = {int(t): e for t, e in positions[p].items()}
        actual = entries[ids[p]]
        assert actual["logprob"] == pytest.approx(rows[p][ids[p]], abs=TOLERANCE)
        assert actual["decoded_token"] == reference.tokenizer.decode([ids[p]])
        assert_rank(rows[p], ids[p], actual["rank"])
        top = sorted((e["rank"], t, e["logprob"]) for t, e in entries.items() if e["rank"] <= k)
        if k:
            assert [r for r, _, _ in top] == list(range(1, k + 1))
            assert_top_k(rows[p], [t for _, t, _ in top], [lp for _, _, lp in top], k)
        assert len(entries) == (k if actual["rank"] <= k else k + 1)


def test_span_scoring_with_logprob_start_len(complete, reference):
    ids = reference.tokenizer.encode(LONGER)
    start = len(ids) - 5
    rows = reference.prompt_rows(ids)
    logprobs = complete(prompt=ids, max_tokens=1, temperature=0,
                        logprob_start_len=start)["choices"][0]["logprobs"]
    assert logprobs["token_ids"] == ids[start:]
    np.testing.assert_allclose(logprobs["token_logprobs"],
                               [rows[p][ids[p]] for p in range(start, len(ids))], atol=TOLERANCE)


def test_usage_counts(complete, reference):
    body = complete(prompt=[TEXT, TEXT], max_tokens=3, n=2, temperature=0, logprobs=0)
    generated = sum(len(c["logprobs"]["tokens"]) for c in body["choices"])
    prompt_tokens = 2 * len(reference.tokenizer.encode(TEXT))
    assert body["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
                             "total_tokens": prompt_tokens + generated}


@pytest.mark.parametrize("field, value, param, code", [
    ("logprobs", True, "logprobs", "invalid_request"),
    ("max_tokens", True, "max_tokens", "invalid_request"),
    ("temperature", True, "temperature", "invalid_request"),
    ("max_tokens", 0, "max_tokens", "invalid_request"),
    ("logprobs", MAX_LOGPROBS + 1, "logprobs", "invalid_request"),
    ("prompt_logprobs", MAX_LOGPROBS + 1, "prompt_logprobs", "invalid_request"),
    ("max_tokens", MAX_MODEL_LEN, "max_tokens", "context_length_exceeded"),
    ("prompt_logprob", 1, "prompt_logprob", "unknown_field"),
])
def test_contract_violations_are_400(http, field, value, param, code):
    response = http.post("/v1/completions", json={"model": MODEL, "prompt": TEXT, field: value})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error")
    assert error["message"]


def test_unknown_model_is_404(http):
    response = http.post("/v1/completions", json={"model": "gpt-unknown", "prompt": TEXT})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"


def test_malformed_json_is_400(http):
    response = http.post("/v1/completions", content=b"{not json",
                         headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"
