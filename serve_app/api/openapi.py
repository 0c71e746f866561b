"""The OpenAPI document at /openapi.json: the request models are the contract, so their JSON
Schema is the request body, and every refusal is the error envelope."""

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from serve_app.api.request_models import (
    BatchRequest,
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)

SCHEMAS = "#/components/schemas/"
ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "properties": {
            "message": {"type": "string"},
            "type": {"type": "string"},
            "param": {"type": ["string", "null"]},
            "code": {"type": "string"},
        },
    }},
}
ERROR_STATUSES = {
    "400": "the request breaks the contract: `code` and `param` say how",
    "404": "unknown model (`model_not_found`) or path",
    "413": "the body is over the size limit",
    "415": "the body is not application/json",
}


def error_responses(statuses: dict[str, str]) -> dict:
    content = {"application/json": {"schema": {"$ref": SCHEMAS + "Error"}}}
    return {status: {"description": text, "content": content} for status, text in statuses.items()}


STREAMED = ("; with `stream: true`, server-sent events of {chunk} objects ending in "
            "`data: [DONE]`")
OPERATIONS = {  # path: (request model, what a 200 holds)
    "/v1/completions": (CompletionRequest, "a text_completion object" +
                        STREAMED.format(chunk="text_completion")),
    "/v1/chat/completions": (ChatRequest, "a chat.completion object" +
                             STREAMED.format(chunk="chat.completion.chunk")),
    "/tokenize": (TokenizeRequest, "`{tokens, count, max_model_len}`"),
    "/detokenize": (DetokenizeRequest, "`{prompt}`: the text of the tokens"),
    "/v1/batches": (BatchRequest, "a batch object (OpenAI's), status `validating`"),
}


def operation(model: type, answer: str) -> dict:
    streams = "stream" in model.model_fields
    content = {"application/json": {"schema": {"type": "object"}}}
    if streams:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    return {
        "requestBody": {"required": True, "content": {
            "application/json": {"schema": {"$ref": SCHEMAS + model.__name__}}}},
        "responses": {"200": {"description": answer, "content": content},
                      **error_responses(ERROR_STATUSES)},
    }


def build_openapi(app: FastAPI) -> dict:
    schema = get_openapi(title=app.title, version=app.version, summary=app.summary,
                         routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for path, (model, answer) in OPERATIONS.items():
        request = model.model_json_schema(ref_template=SCHEMAS + "{model}")
        components.update(request.pop("$defs", {}))
        components[model.__name__] = request
        schema["paths"][path]["post"].update(operation(model, answer))
    components["Error"] = ERROR_SCHEMA
    schema["paths"]["/health"]["get"]["responses"].update(
        error_responses({"503": "a model is not ready"}))
    return schema


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = openapi
