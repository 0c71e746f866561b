"""Request models: the contract, parsed strictly, with errors a client program can act on.

Strict types: a JSON `true` is never a number, a float never a count, a string never a number.
Unknown fields are refused with their name, so a typo such as `prompt_logprob` fails loudly.
Every endpoint's request model derives from StrictRequest and is parsed by `parse_request`.
"""

from typing import Annotated, Literal, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from serve_app.config import SERVED_NAME
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


LogitBias = Annotated[dict[str, Annotated[float, Field(ge=-100, le=100)]], Field(max_length=MAX_LOGIT_BIAS)]


class SamplingRequest(StrictRequest):
    """The fields /v1/completions and /v1/chat/completions share, with the same rules."""

    model: str
    # Omitted: up to the context window (what the prompt leaves of `max_model_len`).
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    n: int = Field(1, ge=1)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop: Stop | None = None
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    logit_bias: LogitBias | None = None
    logprob_token_ids: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Prompt scores: as vLLM names them on both endpoints.
    echo: bool = False
    prompt_logprobs: int | None = Field(None, ge=-1)
    logprob_start_len: int | None = Field(None, ge=0)

    def token_limit(self) -> tuple[str, int | None]:
        """The field that bounds the generated tokens, and its value."""
        return "max_tokens", self.max_tokens


class CompletionRequest(SamplingRequest):
    prompt: Prompt
    logprobs: int | None = Field(None, ge=0)
    # Accepted for OpenAI compatibility when they ask for what the service does anyway.
    best_of: int | None = Field(None, ge=1)
    suffix: str | None = None

    def top_k(self) -> int | None:
        """The top-k of each reported position; None: no logprobs. Labels turn them on."""
        return 0 if self.logprobs is None and self.logprob_token_ids else self.logprobs


class TextPart(StrictRequest):
    type: Literal["text"]
    text: str


class ChatMessage(StrictRequest):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | Annotated[list[TextPart], Field(min_length=1)]
    name: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


Messages = Annotated[list[ChatMessage], Field(min_length=1)]
# Variables for the chat template, as vLLM's chat_template_kwargs.
TemplateKwargs = Annotated[dict[str, JsonValue], Field(max_length=32)]


class ChatTemplateOptions(StrictRequest):
    """How messages are rendered, as vLLM names the options on /tokenize and chat."""

    # Default: the assistant's opening, unless the final message is continued.
    add_generation_prompt: bool | None = None
    continue_final_message: bool = False
    chat_template_kwargs: TemplateKwargs | None = None

    def generation_prompt(self) -> bool:
        if self.add_generation_prompt is None:
            return not self.continue_final_message
        return self.add_generation_prompt


class ChatRequest(SamplingRequest, ChatTemplateOptions):
    messages: Messages
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0)
    # The final message's tokens scored, each with its piece of the message's text.
    score_final_message: bool = False

    def top_k(self) -> int | None:
        """`top_logprobs > 0` turns `logprobs` on, as labels do."""
        if self.logprobs or self.top_logprobs or self.logprob_token_ids:
            return self.top_logprobs or 0
        return None

    def scored_width(self) -> int:
        """Entries a scored prompt position lists after its token: the labels, or the top k."""
        return len(self.logprob_token_ids) if self.logprob_token_ids else self.top_logprobs or 0

    def prompt_width(self) -> int | None:
        """The width of the response's `prompt_logprobs`, or None: not asked. Echo (and a
        span) score the prompt at the top_logprobs width, as vLLM does for echo."""
        if self.prompt_logprobs is not None:
            return self.prompt_logprobs
        return self.scored_width() if self.echo or self.logprob_start_len is not None else None

    def response_role(self) -> str:
        """As vLLM: the assistant's after its opening, else the final message's role."""
        return "assistant" if self.generation_prompt() else self.messages[-1].role

    def token_limit(self) -> tuple[str, int | None]:
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        return "max_tokens", self.max_tokens


class TokenizeRequest(ChatTemplateOptions):
    """vLLM's POST /tokenize: a prompt, or chat messages rendered with the model's template.
    `model` may be left out where the caller has one model."""

    model: str
    prompt: str | None = None
    messages: Messages | None = None
    # Default: the tokenizer's special tokens for a prompt (as /v1/completions adds them); none
    # on top of the chat template's for messages (as /v1/chat/completions renders them).
    add_special_tokens: bool | None = None
    return_token_strs: bool = False


class DetokenizeRequest(StrictRequest):
    model: str
    tokens: list[Annotated[int, Field(ge=0)]]


class LoadAdapterRequest(StrictRequest):
    """vLLM's POST /v1/load_lora_adapter, with the base model named where several serve LoRA."""

    lora_name: Annotated[str, Field(pattern=SERVED_NAME, max_length=128)]
    lora_path: Annotated[str, Field(min_length=1, max_length=4096)]
    base_model: str | None = None
    load_inplace: bool = False  # replace the caller's own adapter of that name


class UnloadAdapterRequest(StrictRequest):
    """vLLM's POST /v1/unload_lora_adapter."""

    lora_name: str


BATCH_ENDPOINTS = ("/v1/completions", "/v1/chat/completions")
MetadataKey = Annotated[str, Field(max_length=64)]
MetadataValue = Annotated[str, Field(max_length=512)]


class BatchRequest(StrictRequest):
    """OpenAI's POST /v1/batches."""

    input_file_id: str
    endpoint: Literal[BATCH_ENDPOINTS]
    completion_window: Literal["24h"]
    metadata: Annotated[dict[MetadataKey, MetadataValue], Field(max_length=16)] | None = None


def sampling_rules(max_logprobs: int | str, max_n: int | str, max_label_ids: int | str) -> dict[str, str]:
    """What each shared field accepts, in words, for error messages."""
    return {
        "model": "a string naming a model from GET /v1/models",
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
        "logprob_token_ids": f"a list of 1 to {max_label_ids} distinct token ids",
        "stream": "a boolean",
        "stream_options": 'an object {"include_usage": boolean}',
        "user": "a string",
        "echo": "a boolean",
        "prompt_logprobs": f"-1 or an integer from 0 to {max_logprobs}",
        "logprob_start_len": "an integer of at least 0",
    }


def completion_rules(max_logprobs: int | str, max_n: int | str, max_label_ids: int | str) -> dict[str, str]:
    return {
        **sampling_rules(max_logprobs, max_n, max_label_ids),
        "prompt": "a string, a non-empty list of token ids, or a non-empty list of either",
        "logprobs": f"an integer from 0 to {max_logprobs}",
        "best_of": "an integer of at least 1",
        "suffix": "a string",
    }


MESSAGES_RULE = ('a non-empty list of {"role": "system" | "developer" | "user" | "assistant", '
                 '"content": a string or a list of {"type": "text", "text": string}}')
TEMPLATE_RULES = {
    "add_generation_prompt": "a boolean",
    "continue_final_message": "a boolean",
    "chat_template_kwargs": "an object of at most 32 variables for the chat template",
}


def chat_rules(max_logprobs: int | str, max_n: int | str, max_label_ids: int | str) -> dict[str, str]:
    return {
        **sampling_rules(max_logprobs, max_n, max_label_ids),
        **TEMPLATE_RULES,
        "messages": MESSAGES_RULE,
        "max_completion_tokens": "an integer of at least 1",
        "logprobs": "a boolean",
        "top_logprobs": f"an integer from 0 to {max_logprobs}",
        "score_final_message": "a boolean",
    }


TOKENIZE_RULES = {
    "model": "a string naming a model from GET /v1/models",
    "prompt": "a string",
    "messages": MESSAGES_RULE,
    "add_special_tokens": "a boolean",
    **TEMPLATE_RULES,
    "return_token_strs": "a boolean",
}
DETOKENIZE_RULES = {
    "model": "a string naming a model from GET /v1/models",
    "tokens": "a list of token ids",
}
LOAD_ADAPTER_RULES = {
    "lora_name": "the adapter's new model id: up to 128 letters, digits and . _ : - "
                 "(not starting with a punctuation mark)",
    "lora_path": "the adapter's folder (PEFT's adapter_config.json and "
                 "adapter_model.safetensors) under one of the service's adapter roots",
    "base_model": "the model the adapter is for, from GET /v1/models (needed where several "
                  "models serve adapters)",
    "load_inplace": "a boolean: true replaces your adapter of that name",
}
UNLOAD_ADAPTER_RULES = {"lora_name": "the name of an adapter you loaded"}
BATCH_RULES = {
    "input_file_id": "the id of a file uploaded with purpose batch",
    "endpoint": " or ".join(BATCH_ENDPOINTS),
    "completion_window": '"24h"',
    "metadata": "an object of at most 16 strings, keys of up to 64 characters, values up to 512",
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


def path(location: tuple) -> str:
    """A location inside a body as a client writes it: `messages[0].role`."""
    text = str(location[0])
    for part in location[1:]:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


def first_error(error: ValidationError, body: dict, rules: dict[str, str]) -> APIError:
    """The first problem in a request, as an APIError that names the (top-level) field."""
    detail = error.errors(include_url=False)[0]
    # Union members tag locations with their type (`list[TextPart]`): not a client's name.
    location = tuple(p for p in detail["loc"] if isinstance(p, int) or p.isidentifier())
    field = str(location[0]) if location else None
    if detail["type"] == "extra_forbidden" and len(location) == 1:
        return invalid(field, f"unknown field {field!r}: the accepted fields are "
                       f"{', '.join(rules)}", "unknown_field")
    if detail["type"] == "extra_forbidden":
        return invalid(field, f"unknown field {path(location)!r}: {field} must be {rules[field]}",
                       "unknown_field")
    if detail["type"] == "missing":
        where = path(location)
        return invalid(field, f"{where} is required: {field} must be {rules[field]}"
                       if len(location) > 1 else f"{field} is required: {rules[field]}")
    return field_error(field, rules, body.get(field))


def parse_request(model: type[Request], body: dict, rules: dict[str, str]) -> Request:
    try:
        return model.model_validate(body)
    except ValidationError as error:
        raise first_error(error, body, rules) from None
