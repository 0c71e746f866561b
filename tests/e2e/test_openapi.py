"""/openapi.json describes the contract the ingress enforces."""

import pytest


def test_openapi_describes_the_completion_request(http):
    document = http.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    request = schemas["CompletionRequest"]
    assert request["additionalProperties"] is False
    assert set(request["required"]) == {"model", "prompt"}
    assert request["properties"]["max_tokens"]["default"] is None  # up to the context window
    operation = document["paths"]["/v1/completions"]["post"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/CompletionRequest"}
    error = operation["responses"]["400"]["content"]["application/json"]["schema"]
    assert error == {"$ref": "#/components/schemas/Error"}
    assert "/v1/models" in document["paths"] and "/health" in document["paths"]


@pytest.mark.parametrize("path, model", [("/v1/chat/completions", "ChatRequest"),
                                         ("/tokenize", "TokenizeRequest"),
                                         ("/detokenize", "DetokenizeRequest"),
                                         ("/v1/batches", "BatchRequest")])
def test_every_endpoint_has_its_request_model(http, path, model):
    document = http.get("/openapi.json").json()
    body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": f"#/components/schemas/{model}"}
    assert document["components"]["schemas"][model]["additionalProperties"] is False


def test_no_page_needs_the_internet(http):
    """/docs would load Swagger UI from a CDN: the service has no such page."""
    assert http.get("/docs").status_code == 404 and http.get("/redoc").status_code == 404
