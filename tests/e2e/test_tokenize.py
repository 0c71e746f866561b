"""POST /tokenize, /detokenize and GET /tokenizer_info: the server's own tokenizer and chat
template, in vLLM's shape."""

import pytest

from serve_app.store.model_store import embedded_model_path
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
@pytest.mark.parametrize("options", [{"add_generation_prompt": True}, {"add_generation_prompt": False},
                                     {"continue_final_message": True}])
def test_messages_as_chat_renders_them(http, references, family, options):
    tokenizer = references[family].tokenizer
    messages = [*MESSAGES, {"role": "assistant", "content": "General"}]
    expected = tokenizer.apply_chat_template(messages, tokenize=True, **options)["input_ids"]
    body = post(http, "/tokenize", model=family, messages=messages, return_token_strs=True, **options)
    assert body["tokens"] == list(expected) and body["count"] == len(expected)
    assert body["token_strs"] == tokenizer.convert_ids_to_tokens(list(expected))


def test_template_variables_and_special_tokens_on_top(http, references):
    """chat_template_kwargs reach the template; add_special_tokens adds the tokenizer's own
    (Llama 3's BOS) in front of what the template writes."""
    tokenizer = references["tiny-llama3"].tokenizer
    rendered = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    body = post(http, "/tokenize", model="tiny-llama3", messages=MESSAGES, add_special_tokens=True,
                chat_template_kwargs={"bos_token": ""})
    assert body["tokens"] == tokenizer.encode(rendered.removeprefix(tokenizer.bos_token))


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenizer_info(http, references, family):
    tokenizer = references[family].tokenizer
    info = http.get("/tokenizer_info", params={"model": family}).json()
    for name in ("eos_token", "bos_token", "unk_token"):
        assert info.get(name) == getattr(tokenizer, name)
    assert info.get("chat_template") == tokenizer.chat_template
    assert (info["model_max_length"], info["tokenizer_class"]) == (MAX_MODEL_LEN, type(tokenizer).__name__)
    added = {str(i): token.content for i, token in tokenizer.added_tokens_decoder.items()}
    assert info["added_tokens_decoder"] == added
    assert "name_or_path" not in info and str(embedded_model_path(family)) not in str(info)


def test_a_model_must_be_named_among_several(http):
    """A caller with one model may leave it out (tests/e2e/test_lm_eval.py); here are five."""
    for response in (http.get("/tokenizer_info"), http.post("/tokenize", json={"prompt": "x"}),
                     http.post("/detokenize", json={"tokens": [1]})):
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == "model"


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
    ("/tokenize", {"model": MODEL, "prompt": "x", "continue_final_message": True},
     "continue_final_message", "invalid_combination"),
    ("/tokenize", {"model": MODEL, "messages": MESSAGES, "continue_final_message": True,
                   "add_generation_prompt": True}, "continue_final_message", "invalid_combination"),
    ("/tokenize", {"model": MODEL, "messages": MESSAGES, "chat_template_kwargs": {"tokenize": True}},
     "chat_template_kwargs", "invalid_chat_template_kwargs"),
    ("/tokenize", {"model": MODEL, "prompt": "x", "return_token_strs": 1}, "return_token_strs",
     "invalid_request"),
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
