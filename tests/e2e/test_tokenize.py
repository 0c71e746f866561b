"""POST /tokenize and /detokenize: the server's own tokenizer and chat template, in vLLM's shape."""

import pytest

from tests.e2e.conftest import FAMILIES, MAX_MODEL_LEN, MODEL
from tests.e2e.text_pieces import SAMPLES

MESSAGES = [{"role": "user", "content": "Hello there"}]


def post(http, path: str, status: int = 200, **body) -> dict:
    response = http.post(path, json=body)
    assert response.status_code == status, response.text
    return response.json()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_a_prompt_as_completions_reads_it(http, references, family, sample):
    tokenizer = references[family].tokenizer
    text = SAMPLES[sample]
    body = post(http, "/tokenize", model=family, prompt=text)
    assert body == {"tokens": tokenizer.encode(text), "count": len(tokenizer.encode(text)),
                    "max_model_len": MAX_MODEL_LEN}
    bare = post(http, "/tokenize", model=family, prompt=text, add_special_tokens=False)
    assert bare["tokens"] == tokenizer.encode(text, add_special_tokens=False)
    assert post(http, "/detokenize", model=family, tokens=body["tokens"])["prompt"] == \
        tokenizer.decode(body["tokens"])


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-llama3"])
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_messages_as_chat_renders_them(http, references, family, generation_prompt):
    expected = references[family].tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=generation_prompt, tokenize=True)["input_ids"]
    body = post(http, "/tokenize", model=family, messages=MESSAGES,
                add_generation_prompt=generation_prompt)
    assert body["tokens"] == list(expected) and body["count"] == len(expected)


def test_completions_and_tokenize_agree(http, complete):
    """The use they are for: logprob_start_len from the server's own count."""
    prefix, span = "The capital of France is", " Paris."
    whole = post(http, "/tokenize", model=MODEL, prompt=prefix + span)["tokens"]
    span_ids = post(http, "/tokenize", model=MODEL, prompt=span, add_special_tokens=False)["tokens"]
    start = len(whole) - len(span_ids)
    logprobs = complete(prompt=whole, max_tokens=1, logprob_start_len=start)["choices"][0]["logprobs"]
    assert logprobs["token_ids"][:len(span_ids)] == whole[start:]


@pytest.mark.parametrize("path, body, param, code", [
    ("/tokenize", {"model": MODEL}, "prompt", "invalid_request"),
    ("/tokenize", {"model": MODEL, "prompt": "x", "messages": MESSAGES}, "prompt", "invalid_request"),
    ("/tokenize", {"model": MODEL, "prompt": 5}, "prompt", "invalid_request"),
    ("/tokenize", {"model": MODEL, "prompt": "x", "add_generation_prompt": True},
     "add_generation_prompt", "invalid_combination"),
    ("/tokenize", {"model": MODEL, "messages": MESSAGES, "add_special_tokens": True},
     "add_special_tokens", "invalid_combination"),
    ("/tokenize", {"model": "tiny-sentencepiece", "messages": MESSAGES}, "model", "no_chat_template"),
    ("/tokenize", {"model": MODEL, "prompt": "x", "extra": 1}, "extra", "unknown_field"),
    ("/detokenize", {"model": MODEL, "tokens": [1, 10**7]}, "tokens", "invalid_token_id"),
    ("/detokenize", {"model": MODEL, "tokens": [True]}, "tokens", "invalid_request"),
])
def test_refusals(http, path, body, param, code):
    error = post(http, path, 400, **body)["error"]
    assert (error["param"], error["code"]) == (param, code)


def test_unknown_model(http):
    assert post(http, "/tokenize", 404, model="nope", prompt="x")["error"]["code"] == "model_not_found"
