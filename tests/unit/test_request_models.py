import pytest

from serve_app.api.request_models import CompletionRequest, completion_rules, parse_request
from serve_app.errors import APIError

BASE = {"model": "m", "prompt": "hello"}
RULES = completion_rules(max_logprobs=100, max_n=8, max_label_ids=4)


def parse(body: dict) -> CompletionRequest:
    return parse_request(CompletionRequest, body, RULES)


def refused(**fields) -> APIError:
    with pytest.raises(APIError) as caught:
        parse({**BASE, **fields})
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize("field", ["max_tokens", "logprobs", "prompt_logprobs", "n", "seed",
                                   "temperature", "top_p", "logprob_start_len", "best_of",
                                   "presence_penalty", "frequency_penalty"])
def test_booleans_are_never_numbers(field):
    error = refused(**{field: True})
    assert (error.param, error.code) == (field, "invalid_request")
    assert error.message.endswith("got true")


def test_messages_say_what_is_allowed():
    assert refused(logprobs=True).message == "logprobs must be an integer from 0 to 100, got true"
    assert refused(n=9.5).message == "n must be an integer from 1 to 8, got 9.5"


def test_minus_one_logprobs_points_to_prompt_logprobs():
    assert "prompt_logprobs: -1" in refused(logprobs=-1).message


def test_a_float_is_not_a_count():
    assert refused(max_tokens=1.0).param == "max_tokens"


def test_a_string_is_not_a_number():
    assert refused(temperature="1").param == "temperature"


def test_integers_are_numbers_for_float_fields():
    assert parse({**BASE, "temperature": 0, "top_p": 1}).temperature == 0.0


@pytest.mark.parametrize("fields", [{"max_tokens": 0}, {"temperature": 2.5}, {"top_p": 0},
                                    {"n": 0}, {"seed": -1}, {"seed": 2**63},
                                    {"presence_penalty": 3}, {"prompt_logprobs": -2},
                                    {"logprob_start_len": -1}, {"stop": ["a"] * 5},
                                    {"logit_bias": {"1": 101}}, {"stream_options": {"x": 1}}])
def test_ranges(fields):
    (field,) = fields
    assert refused(**fields).param == field


def test_unknown_field_is_named():
    error = refused(prompt_logprob=5)
    assert (error.param, error.code) == ("prompt_logprob", "unknown_field")
    assert "prompt_logprobs" in error.message


@pytest.mark.parametrize("prompt", [[], [[]], [1, -2], [1.5], {"a": 1}, [True], None, 5])
def test_bad_prompts(prompt):
    assert refused(prompt=prompt).param == "prompt"


@pytest.mark.parametrize("prompt", ["x", [1, 2], ["a", "b"], [[1], [2, 3]]])
def test_prompt_shapes(prompt):
    assert parse({**BASE, "prompt": prompt}).prompt == prompt


def test_missing_model():
    with pytest.raises(APIError) as caught:
        parse({"prompt": "x"})
    assert caught.value.param == "model" and "required" in caught.value.message


def test_booleans_where_booleans_belong():
    request = parse({**BASE, "echo": True, "stream": False})
    assert request.echo is True


def test_prompt_logprobs_minus_one():
    assert parse({**BASE, "prompt_logprobs": -1}).prompt_logprobs == -1


def test_known_openai_fields_are_accepted():
    request = parse({**BASE, "user": "u-1", "best_of": 1, "suffix": None, "logit_bias": {"5": -100},
                     "stream_options": {"include_usage": True}, "stream": True})
    assert request.logit_bias == {"5": -100.0}
