import pytest

from serve_app.api import admission
from serve_app.api.request_models import CompletionRequest, parse_request
from serve_app.config import Capabilities, IngressConfig
from serve_app.engine.wire import Caller
from serve_app.errors import APIError
from tests.unit.fakes import char_vocabulary

VOCAB = char_vocabulary("abcdé€ xyz")
CAPS = Capabilities(max_logprobs=5, max_model_len=32, max_scored_tokens=8, max_logprob_token_ids=8,
                    full_vocab_max_prompt_tokens=4)
INGRESS = IngressConfig(max_batch_prompts=3, max_n=2)


def request(**fields):
    body = {"model": "m", "prompt": "abc", **fields}
    return parse_request(CompletionRequest, body, admission.rules(CAPS, INGRESS))


CALLER = Caller("acme", 0)


def admit(**fields):
    body = request(**fields)
    admission.check_completion(body, CAPS, INGRESS, VOCAB)
    prompts = admission.prompt_inputs(body.prompt, VOCAB, INGRESS.max_batch_prompts)
    admission.check_prompts(prompts, body, CAPS)
    return body, prompts


def refusal(**fields) -> APIError:
    with pytest.raises(APIError) as caught:
        admit(**fields)
    return caught.value


@pytest.mark.parametrize("fields, param, code", [
    ({"logprobs": 6}, "logprobs", "invalid_request"),
    ({"prompt_logprobs": 6}, "prompt_logprobs", "invalid_request"),
    ({"prompt": "abcab", "prompt_logprobs": -1}, "prompt", "full_vocab_prompt_too_long"),
    ({"prompt": ["ab", "abc"], "prompt_logprobs": -1}, "prompt", "full_vocab_prompt_too_long"),
    ({"n": 3}, "n", "invalid_request"),
    ({"stream": True, "echo": True}, "stream", "invalid_combination"),
    ({"stream": True, "prompt_logprobs": 0}, "stream", "invalid_combination"),
    ({"stream": True, "logprob_start_len": 0}, "stream", "invalid_combination"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "invalid_combination"),
    ({"best_of": 2}, "best_of", "unsupported_parameter"),
    ({"suffix": "tail"}, "suffix", "unsupported_parameter"),
    ({"prompt": ["a", "b", "c", "d"]}, "prompt", "batch_too_large"),
    ({"prompt": ""}, "prompt", "invalid_request"),
    ({"prompt": [1, 10]}, "prompt", "invalid_token_id"),
    ({"max_tokens": 30}, "max_tokens", "context_length_exceeded"),
    ({"logprob_start_len": 3}, "logprob_start_len", "invalid_request"),
    ({"prompt": "abcabcabc", "echo": True, "logprobs": 1}, "prompt", "too_many_scored_tokens"),
    ({"prompt": "abcabcabc", "prompt_logprobs": 1}, "prompt", "too_many_scored_tokens"),
])
def test_refusals(fields, param, code):
    error = refusal(**fields)
    assert (error.status, error.param, error.code) == (400, param, code)


def test_cap_is_named_in_the_message():
    assert "from 0 to 5, got 6" in refusal(logprobs=6).message


def test_a_span_within_the_cap_is_admitted():
    # 9 tokens, a cap of 8 scored: the span's 7 from position 2 on are scored and shown.
    body = request(prompt="abcabcabc", logprob_start_len=2, logprobs=1)
    admitted = admission.admit_completion(body, CAPS, INGRESS, VOCAB, CALLER)
    assert admitted.scored_tokens == 7 <= CAPS.max_scored_tokens
    (engine,) = admitted.engine_requests
    assert (engine.prompt_token_ids, engine.prompt_logprobs, engine.prompt_rows_from) == ([0, 1, 2] * 3, 1, 2)


def test_batches_of_each_kind():
    assert [p.token_ids for p in admit(prompt=["ab", [2, 3]])[1]] == [[0, 1], [2, 3]]
    assert admit(prompt=[4, 5])[1][0].text == "é€"


@pytest.mark.parametrize("fields, expected", [
    ({}, None),
    ({"logprobs": 3}, None),
    ({"echo": True}, None),
    ({"echo": True, "logprobs": 2}, 2),
    ({"logprob_start_len": 1}, 0),
    ({"logprob_start_len": 1, "logprobs": 4}, 4),
    ({"prompt_logprobs": 3, "echo": True, "logprobs": 1}, 3),
    ({"prompt_logprobs": 0}, 0),
    ({"prompt_logprobs": -1, "echo": True, "logprobs": 3}, -1),
])
def test_engine_prompt_top_k_covers_every_use(fields, expected):
    body, (prompt,) = admit(**fields)
    assert admission.engine_request(prompt, body, CAPS, CALLER).prompt_logprobs == expected


@pytest.mark.parametrize("fields, expected", [
    ({"logprob_start_len": 2}, 2),
    ({"logprob_start_len": 2, "echo": True, "logprobs": 1}, 2),
    ({"echo": True, "logprobs": 1}, 0),
    ({"logprob_start_len": 2, "prompt_logprobs": 1}, 0),  # every row is shown
    ({"logprobs": 1}, 0),
])
def test_the_first_shown_row_is_the_spans_start_unless_every_row_is_shown(fields, expected):
    body, (prompt,) = admit(prompt="abcabc", **fields)
    assert admission.engine_request(prompt, body, CAPS, CALLER).prompt_rows_from == expected


def test_stop_becomes_a_list():
    body, (prompt,) = admit(stop="x")
    assert admission.engine_request(prompt, body, CAPS, CALLER).stop == ["x"]
    body, (prompt,) = admit(stop=["", "y"])
    assert admission.engine_request(prompt, body, CAPS, CALLER).stop == ["y"]


def test_logit_bias_keys_are_token_ids():
    assert admission.logit_bias(request(logit_bias={"3": 5, "0": -100}), 10) == {3: 5.0, 0: -100.0}
    for key in ("10", "-1", "x", "1.0", "\u0661"):
        with pytest.raises(APIError) as caught:
            admission.logit_bias(request(logit_bias={key: 1}), 10)
        assert (caught.value.param, caught.value.code) == ("logit_bias", "invalid_token_id")


@pytest.mark.parametrize("fields, param, code", [
    ({"logprob_token_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9]}, "logprob_token_ids", "invalid_request"),
    ({"logprob_token_ids": [1, 1]}, "logprob_token_ids", "invalid_request"),
    ({"logprob_token_ids": [10]}, "logprob_token_ids", "invalid_token_id"),
    ({"logprob_token_ids": [1], "logprobs": 1}, "logprobs", "invalid_combination"),
    ({"logprob_token_ids": [1], "prompt_logprobs": 0}, "prompt_logprobs", "invalid_combination"),
])
def test_label_refusals(fields, param, code):
    error = refusal(**fields)
    assert (error.param, error.code) == (param, code)


def test_labels_turn_logprobs_on_where_they_are_reported():
    body, (prompt,) = admit(logprob_token_ids=[4, 1], echo=True)
    engine = admission.engine_request(prompt, body, CAPS, CALLER)
    assert (engine.logprobs, engine.prompt_logprobs, engine.logprob_token_ids) == (0, 0, [4, 1])
    body, (prompt,) = admit(logprob_token_ids=[4])
    assert admission.engine_request(prompt, body, CAPS, CALLER).prompt_logprobs is None


def test_max_tokens_omitted_fills_the_context():
    body, (prompt,) = admit(prompt="abc")
    assert admission.engine_request(prompt, body, CAPS, CALLER).max_tokens == CAPS.max_model_len - 3
    error = refusal(prompt="abc" * 11)  # 33 tokens: no room left in 32
    assert (error.param, error.code) == ("prompt", "context_length_exceeded")


def test_every_engine_request_is_built_with_its_caller_s_tenant_and_priority():
    caller = Caller("acme", 3)
    body = request(prompt=["ab", "ba", "abc"], max_tokens=1)
    admitted = admission.admit_completion(body, CAPS, INGRESS, VOCAB, caller)
    assert [(r.tenant, r.priority) for r in admitted.engine_requests] == [("acme", 3)] * 3
