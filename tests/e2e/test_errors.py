"""One test per row of docs/errors.md, over HTTP; and proof that refused requests never reach
a model replica."""

import pathlib
import re

import pytest
from ray import serve

from serve_app.ops.app import model_deployment_name
from serve_app.ops.local_ray import APP_NAME
from tests.e2e.conftest import FULL_VOCAB_MAX, MAX_LOGPROBS, MAX_MODEL_LEN, MAX_SCORED, MODEL

ERRORS_DOC = pathlib.Path(__file__).parents[2] / "docs" / "errors.md"
JSON = {"content-type": "application/json"}
TEXT = "The capital of France is"


def completion(**fields):
    return {"json": {"model": MODEL, "prompt": TEXT, "max_tokens": 1, **fields}}


# code -> (method, path, request keyword arguments, HTTP status, param)
PROVOCATIONS = {
    "invalid_json": ("POST", "/v1/completions", {"content": b'{"model": ', "headers": JSON}, 400, None),
    "invalid_request": ("POST", "/v1/completions", completion(logprobs=True), 400, "logprobs"),
    "unknown_field": ("POST", "/v1/completions", completion(prompt_logprob=3), 400, "prompt_logprob"),
    "invalid_token_id": ("POST", "/v1/completions", completion(prompt=[1, 10**9]), 400, "prompt"),
    "invalid_combination": ("POST", "/v1/completions", completion(stream=True, echo=True), 400, "stream"),
    "unsupported_parameter": ("POST", "/v1/completions", completion(best_of=3), 400, "best_of"),
    "context_length_exceeded": ("POST", "/v1/completions", completion(max_tokens=MAX_MODEL_LEN), 400,
                                "max_tokens"),
    "too_many_scored_tokens": ("POST", "/v1/completions",
                               completion(prompt=[5] * (MAX_SCORED + 1), prompt_logprobs=1), 400,
                               "prompt"),
    "full_vocab_prompt_too_long": ("POST", "/v1/completions",
                                   completion(prompt=[5] * (FULL_VOCAB_MAX + 1), prompt_logprobs=-1),
                                   400, "prompt"),
    "batch_too_large": ("POST", "/v1/completions", completion(prompt=["a"] * 9), 400, "prompt"),
    "no_chat_template": ("POST", "/v1/chat/completions",
                         {"json": {"model": "tiny-sentencepiece",
                                   "messages": [{"role": "user", "content": "x"}]}}, 400, "model"),
    "invalid_chat_template_kwargs": ("POST", "/v1/chat/completions",
                                     {"json": {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                               "chat_template_kwargs": {"tokenize": True}}},
                                     400, "chat_template_kwargs"),
    "model_not_found": ("POST", "/v1/completions", {"json": {"model": "nope", "prompt": "x"}}, 404,
                        "model"),
    "not_found": ("GET", "/v1/nothing-here", {}, 404, None),
    "method_not_allowed": ("GET", "/v1/completions", {}, 405, None),
    "not_acceptable": ("POST", "/v1/completions",
                       {**completion(), "headers": {"accept": "application/x-npy"}}, 406, None),
    "request_too_large": ("POST", "/v1/completions",
                          {"content": b'{"prompt": "' + b"a" * (17 << 20) + b'"}', "headers": JSON},
                          413, None),
    "file_not_found": ("GET", "/v1/files/file-" + "0" * 32, {}, 404, "file_id"),
    "batch_not_found": ("GET", "/v1/batches/batch_" + "0" * 32, {}, 404, "batch_id"),
    "invalid_upload": ("POST", "/v1/files", {"content": b"--b\r\nnot a part", "headers":
                                             {"content-type": "multipart/form-data; boundary=b"}}, 400, None),
    "missing_file": ("POST", "/v1/files", {"content": b'--b\r\nContent-Disposition: form-data; name="purpose"'
                                           b"\r\n\r\nbatch\r\n--b--\r\n",
                                           "headers": {"content-type": "multipart/form-data; boundary=b"}},
                     400, "file"),
    "invalid_purpose": ("POST", "/v1/files", {"data": {"purpose": "fine-tune"},
                                              "files": {"file": ("x.jsonl", b"{}")}}, 400, "purpose"),
    "unsupported_media_type": ("POST", "/v1/completions",
                               {"content": b"model=x", "headers": {"content-type": "text/plain"}},
                               415, None),
}
# Codes that no well-behaved request can provoke from a healthy service; unit-tested instead.
NOT_PROVOKABLE_OVER_HTTP = {"internal_error", "not_ready"}
# Codes that a model's chat template provokes, which no test model's does (none raises, and
# each writes a message's text as sent): tests/unit/test_conversation.py.
PROVOKED_BY_TEMPLATES = {"chat_template_error", "final_message_not_found"}
# Codes that only many requests together provoke: tests/e2e/test_overload.py.
PROVOKED_BY_BURSTS = {"overloaded"}
# Codes of batches and their files: tests/e2e/test_batch.py (tenant_removed: the unit tests).
PROVOKED_BY_BATCHES = {"file_too_large", "invalid_file_purpose", "invalid_batch_line", "file_in_use",
                       "batch_not_cancellable", "tenant_removed"}
# Codes of LoRA adapters: tests/e2e/test_adapters.py and test_loaded_adapters.py; with keys
# (a tenant's limits, the rank bound of the tenancy application's model, Redis gone),
# tests/e2e/test_tenancy.py.
PROVOKED_BY_ADAPTERS = {"adapter_not_found", "adapter_path_not_allowed", "adapter_mismatch",
                        "lora_not_enabled", "adapter_name_taken", "adapter_configured", "adapter_in_use",
                        "adapter_rank_too_large", "adapter_limit_reached", "adapter_registry_unavailable"}
# Codes of the application with keys: tests/e2e/test_tenancy.py.
PROVOKED_WITH_KEYS = {"missing_api_key", "invalid_api_key", "rate_limit_exceeded",
                      "rate_limit_unavailable", "usage_unavailable"}


def documented_codes() -> set[str]:
    return set(re.findall(r"^\| \d{3} \| `([a-z_]+)` \|", ERRORS_DOC.read_text(), re.MULTILINE))


def test_every_documented_code_is_tested():
    assert documented_codes() == (set(PROVOCATIONS) | NOT_PROVOKABLE_OVER_HTTP | PROVOKED_BY_BURSTS
                                  | PROVOKED_WITH_KEYS | PROVOKED_BY_BATCHES | PROVOKED_BY_TEMPLATES
                                  | PROVOKED_BY_ADAPTERS)


@pytest.mark.parametrize("code", sorted(PROVOCATIONS))
def test_error_row(http, code):
    method, path, kwargs, status, param = PROVOCATIONS[code]
    response = http.request(method, path, **kwargs)
    assert response.status_code == status, response.text[:500]
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param)
    assert error["message"] and error["type"] == "invalid_request_error"


def test_logprobs_above_the_cap_names_it(http):
    error = http.post("/v1/completions", **completion(logprobs=MAX_LOGPROBS + 1)).json()["error"]
    assert error["message"] == f"logprobs must be an integer from 0 to {MAX_LOGPROBS}, got {MAX_LOGPROBS + 1}"


def test_an_unannounced_body_is_cut_off_at_the_limit(http):
    """No Content-Length (chunked): the ingress counts as it reads and stops at the limit."""
    def body():
        yield b'{"model": "%s", "prompt": "' % MODEL.encode()
        for _ in range(40):
            yield b"a" * (1 << 20)
        yield b'"}'

    response = http.post("/v1/completions", content=body(), headers=JSON)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def replica_request_count() -> int:
    handle = serve.get_deployment_handle(model_deployment_name(MODEL), app_name=APP_NAME)
    return handle.request_count.remote().result()


def test_refused_requests_never_reach_a_replica(http):
    before = replica_request_count()
    for code, (method, path, kwargs, _, _) in PROVOCATIONS.items():
        http.request(method, path, **kwargs)
    assert replica_request_count() == before
    http.post("/v1/completions", **completion())
    assert replica_request_count() == before + 1
