"""/openapi.json describes the contract the ingress enforces."""


def test_openapi_describes_the_completion_request(http):
    document = http.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    request = schemas["CompletionRequest"]
    assert request["additionalProperties"] is False
    assert set(request["required"]) == {"model", "prompt"}
    assert request["properties"]["max_tokens"] == {"default": 16, "minimum": 1, "title": "Max Tokens",
                                                   "type": "integer"}
    operation = document["paths"]["/v1/completions"]["post"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/CompletionRequest"}
    error = operation["responses"]["400"]["content"]["application/json"]["schema"]
    assert error == {"$ref": "#/components/schemas/Error"}
    assert "/v1/models" in document["paths"] and "/health" in document["paths"]
