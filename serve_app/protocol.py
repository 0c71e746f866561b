"""Request models: the contract, parsed strictly.

Strict types: a JSON `true` is never a number, a float never a count, a string never a number.
Unknown fields are refused with their name, so a typo such as `prompt_logprob` fails loudly.
"""

from typing import Annotated

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from serve_app.errors import invalid

TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
Prompt = str | TokenIds | Annotated[list[str | TokenIds], Field(min_length=1)]


class StrictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class CompletionRequest(StrictRequest):
    model: str
    prompt: Prompt
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1)
    seed: int | None = None
    stop: str | Annotated[list[str], Field(max_length=4)] | None = None
    logprobs: int | None = Field(None, ge=0)
    echo: bool = False
    prompt_logprobs: int | None = Field(None, ge=-1)
    logprob_start_len: int | None = Field(None, ge=0)
    stream: bool = False
    user: str | None = None  # accepted for OpenAI compatibility; not acted on


FIELD_RULES = {
    "prompt": "a string, a non-empty list of token ids, or a non-empty list of either",
    "stop": "a string or a list of at most 4 strings",
}


def describe(value: object) -> str:
    text = orjson.dumps(value, default=repr).decode()
    return text if len(text) <= 80 else text[:77] + "..."


def first_error(error: ValidationError, body: dict):
    """The first problem in a request, as an APIError that names the field."""
    detail = error.errors(include_url=False)[0]
    location = detail["loc"]
    field = str(location[0]) if location else None
    if detail["type"] == "extra_forbidden":
        return invalid(field, f"unknown field {field!r}: this endpoint does not accept it")
    if detail["type"] == "missing":
        return invalid(field, f"{field} is required")
    got = describe(body.get(field)) if field else describe(body)
    rule = FIELD_RULES.get(field or "", detail["msg"].lower())
    return invalid(field, f"{field} must be {rule}, got {got}" if field in FIELD_RULES
                   else f"{field}: {rule}, got {got}")


def parse_completion_request(body: dict) -> CompletionRequest:
    try:
        return CompletionRequest.model_validate(body)
    except ValidationError as error:
        raise first_error(error, body) from None
