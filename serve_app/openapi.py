"""The OpenAPI document at /openapi.json: the request models are the contract, so their JSON
Schema is the request body, and every refusal is the error envelope."""

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from serve_app.protocol import CompletionRequest

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


def completions_operation() -> dict:
    return {
        "requestBody": {"required": True, "content": {
            "application/json": {"schema": {"$ref": SCHEMAS + "CompletionRequest"}}}},
        "responses": {
            "200": {"description": "a text_completion object; with `stream: true`, server-sent "
                                   "events of text_completion chunks ending in `data: [DONE]`",
                    "content": {"application/json": {"schema": {"type": "object"}},
                                "text/event-stream": {"schema": {"type": "string"}}}},
            **error_responses(ERROR_STATUSES),
        },
    }


def build_openapi(app: FastAPI) -> dict:
    schema = get_openapi(title=app.title, version=app.version, summary=app.summary,
                         routes=app.routes)
    request = CompletionRequest.model_json_schema(ref_template=SCHEMAS + "{model}")
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(request.pop("$defs", {}))
    components["CompletionRequest"] = request
    components["Error"] = ERROR_SCHEMA
    schema["paths"]["/v1/completions"]["post"].update(completions_operation())
    schema["paths"]["/health"]["get"]["responses"].update(
        error_responses({"503": "a model is not ready"}))
    return schema


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = openapi
