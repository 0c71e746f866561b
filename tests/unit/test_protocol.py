import pytest

from serve_app.errors import APIError
from serve_app.protocol import parse_completion_request

BASE = {"model": "m", "prompt": "hello"}


def refused(**fields) -> APIError:
    with pytest.raises(APIError) as caught:
        parse_completion_request({**BASE, **fields})
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize("field", ["max_tokens", "logprobs", "prompt_logprobs", "n", "seed",
                                   "temperature", "top_p", "logprob_start_len"])
def test_booleans_are_never_numbers(field):
    error = refused(**{field: True})
    assert (error.param, error.code) == (field, "invalid_request")
    assert "got true" in error.message


def test_a_float_is_not_a_count():
    assert refused(max_tokens=1.0).param == "max_tokens"


def test_a_string_is_not_a_number():
    assert refused(temperature="1").param == "temperature"


def test_integers_are_numbers_for_float_fields():
    assert parse_completion_request({**BASE, "temperature": 0, "top_p": 1}).temperature == 0.0


def test_max_tokens_zero():
    assert "greater than or equal to 1" in refused(max_tokens=0).message


def test_unknown_field_is_named():
    error = refused(prompt_logprob=5)
    assert error.param == "prompt_logprob" and "unknown field" in error.message


@pytest.mark.parametrize("prompt", [[], [[]], [1, -2], [1.5], {"a": 1}, [True]])
def test_bad_prompts(prompt):
    assert refused(prompt=prompt).param == "prompt"


@pytest.mark.parametrize("prompt", ["x", [1, 2], ["a", "b"], [[1], [2, 3]]])
def test_prompt_shapes(prompt):
    assert parse_completion_request({**BASE, "prompt": prompt}).prompt == prompt


def test_missing_model():
    with pytest.raises(APIError) as caught:
        parse_completion_request({"prompt": "x"})
    assert caught.value.param == "model" and "required" in caught.value.message


def test_booleans_where_booleans_belong():
    request = parse_completion_request({**BASE, "echo": True, "stream": False})
    assert request.echo is True


def test_prompt_logprobs_range():
    assert refused(prompt_logprobs=-2).param == "prompt_logprobs"
    assert parse_completion_request({**BASE, "prompt_logprobs": -1}).prompt_logprobs == -1
