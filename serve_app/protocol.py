"""Request models: the contract, parsed strictly, with errors a client program can act on.

Strict types: a JSON `true` is never a number, a float never a count, a string never a number.
Unknown fields are refused with their name, so a typo such as `prompt_logprob` fails loudly.
Every endpoint's request model derives from StrictRequest and is parsed by `parse_request`.
"""

from typing import Annotated, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from serve_app.errors import APIError, invalid

MAX_SEED = 2**63 - 1
MAX_STOP_STRINGS = 4
MAX_LOGIT_BIAS = 300

TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
Prompt = str | TokenIds | Annotated[list[str | TokenIds], Field(min_length=1)]
Stop = str | Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)]


class StrictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(StrictRequest):
    include_usage: bool = False


class CompletionRequest(StrictRequest):
    model: str
    prompt: Prompt
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop: Stop | None = None
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    logit_bias: Annotated[dict[str, Annotated[float, Field(ge=-100, le=100)]],
                          Field(max_length=MAX_LOGIT_BIAS)] | None = None
    logprobs: int | None = Field(None, ge=0)
    echo: bool = False
    prompt_logprobs: int | None = Field(None, ge=-1)
    logprob_start_len: int | None = Field(None, ge=0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Accepted for OpenAI compatibility when they ask for what the service does anyway.
    best_of: int | None = Field(None, ge=1)
    suffix: str | None = None
    user: str | None = None


def completion_rules(max_logprobs: int | str, max_n: int | str) -> dict[str, str]:
    """What each field accepts, in words, for error messages."""
    return {
        "model": "a string naming a model from GET /v1/models",
        "prompt": "a string, a non-empty list of token ids, or a non-empty list of either",
        "max_tokens": "an integer of at least 1",
        "temperature": "a number from 0 to 2",
        "top_p": "a number above 0 and at most 1",
        "n": f"an integer from 1 to {max_n}",
        "seed": f"an integer from 0 to {MAX_SEED}",
        "stop": f"a string or a list of at most {MAX_STOP_STRINGS} strings",
        "presence_penalty": "a number from -2 to 2",
        "frequency_penalty": "a number from -2 to 2",
        "logit_bias": f"an object of at most {MAX_LOGIT_BIAS} token ids (as strings) "
                      "to numbers from -100 to 100",
        "logprobs": f"an integer from 0 to {max_logprobs}",
        "echo": "a boolean",
        "prompt_logprobs": f"-1 or an integer from 0 to {max_logprobs}",
        "logprob_start_len": "an integer of at least 0",
        "stream": "a boolean",
        "stream_options": 'an object {"include_usage": boolean}',
        "best_of": "an integer of at least 1",
        "suffix": "a string",
        "user": "a string",
    }


HINTS = {
    ("logprobs", -1): "the full vocabulary is prompt-only: ask for prompt_logprobs: -1",
}

Request = TypeVar("Request", bound=StrictRequest)


def describe(value: object) -> str:
    text = orjson.dumps(value, default=repr).decode()
    return text if len(text) <= 80 else text[:77] + "..."


def field_error(field: str, rules: dict[str, str], value: object) -> APIError:
    message = f"{field} must be {rules[field]}, got {describe(value)}"
    hint = HINTS.get((field, value)) if not isinstance(value, (dict, list)) else None
    return invalid(field, f"{message}: {hint}" if hint else message)


def first_error(error: ValidationError, body: dict, rules: dict[str, str]) -> APIError:
    """The first problem in a request, as an APIError that names the field."""
    detail = error.errors(include_url=False)[0]
    field = str(detail["loc"][0]) if detail["loc"] else None
    if detail["type"] == "extra_forbidden":
        return invalid(field, f"unknown field {field!r}: the accepted fields are "
                       f"{', '.join(rules)}", "unknown_field")
    if detail["type"] == "missing":
        return invalid(field, f"{field} is required: {rules[field]}")
    return field_error(field, rules, body.get(field))


def parse_request(model: type[Request], body: dict, rules: dict[str, str]) -> Request:
    try:
        return model.model_validate(body)
    except ValidationError as error:
        raise first_error(error, body, rules) from None
