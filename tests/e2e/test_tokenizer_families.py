"""Exact text on every tokenizer family: byte-level BPE without BOS (tiny-llama), byte-level
BPE with Llama 3's BOS (tiny-llama3), SentencePiece with byte fallback (tiny-sentencepiece);
ASCII, accented, CJK and emoji text; echo, spans and generated tokens; string and id prompts.
The pieces must partition the returned text, and the numbers match the reference."""

import numpy as np
import pytest

from tests.e2e.conftest import FAMILIES
from tests.e2e.reference import TOLERANCE
from tests.e2e.text_pieces import SAMPLES, assert_pieces, special_tokens

CASES = [(family, sample) for family in FAMILIES for sample in SAMPLES]


def check(choice: dict, tokenizer, text: str | None = None) -> None:
    logprobs = choice["logprobs"]
    specials, names = special_tokens(tokenizer)
    assert_pieces(text if text is not None else choice["text"], logprobs["tokens"],
                  logprobs["text_offset"], logprobs["token_ids"], specials, names)


@pytest.mark.parametrize("family, sample", CASES)
def test_echo_of_a_string_prompt(complete, references, family, sample):
    reference, text = references[family], SAMPLES[sample]
    ids = reference.tokenizer.encode(text)
    choice = complete(model=family, prompt=text, echo=True, logprobs=1, max_tokens=4,
                      temperature=0)["choices"][0]
    assert choice["text"].startswith(text)  # the string as sent: no BOS text in it
    check(choice, reference.tokenizer)
    logprobs = choice["logprobs"]
    assert logprobs["token_ids"][:len(ids)] == ids
    rows = reference.prompt_rows(ids)
    np.testing.assert_allclose(logprobs["token_logprobs"][1:len(ids)],
                               [rows[p][ids[p]] for p in range(1, len(ids))], atol=TOLERANCE)


@pytest.mark.parametrize("family, sample", CASES)
def test_echo_of_token_ids(complete, references, family, sample):
    reference = references[family]
    ids = reference.tokenizer.encode(SAMPLES[sample])
    choice = complete(model=family, prompt=ids, echo=True, logprobs=0, max_tokens=3,
                      temperature=0)["choices"][0]
    # Token ids are echoed as the tokenizer decodes them, special tokens written out.
    assert choice["text"].startswith(reference.tokenizer.decode(ids))
    check(choice, reference.tokenizer)


@pytest.mark.parametrize("family, sample", CASES)
@pytest.mark.parametrize("form", ["string", "ids"])
def test_a_span_indexes_the_prompt_then_the_completion(complete, references, family, sample, form):
    reference, text = references[family], SAMPLES[sample]
    ids = reference.tokenizer.encode(text)
    prompt = text if form == "string" else ids
    choice = complete(model=family, prompt=prompt, logprob_start_len=3, logprobs=0, max_tokens=3,
                      temperature=0)["choices"][0]
    prompt_text = text if form == "string" else reference.tokenizer.decode(ids)
    logprobs = choice["logprobs"]
    assert logprobs["token_ids"][:len(ids) - 3] == ids[3:]
    check(choice, reference.tokenizer, prompt_text + choice["text"])


@pytest.mark.parametrize("family, sample", CASES)
def test_generated_tokens(complete, references, family, sample):
    """Sampled from a random model: byte pieces, partial characters and special tokens come."""
    reference = references[family]
    ids = reference.tokenizer.encode(SAMPLES[sample])
    for seed in range(3):
        choice = complete(model=family, prompt=SAMPLES[sample], logprobs=2, max_tokens=24,
                          temperature=1.0, seed=seed)["choices"][0]
        check(choice, reference.tokenizer)
        generated = choice["logprobs"]["token_ids"]
        rows = reference.log_softmax(ids + generated)[len(ids) - 1:-1]
        np.testing.assert_allclose(choice["logprobs"]["token_logprobs"],
                                   rows[np.arange(len(generated)), generated], atol=TOLERANCE)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_stop_string_cuts_the_last_piece(complete, references, family):
    text = SAMPLES["accented"]
    full = complete(model=family, prompt=text, max_tokens=16, temperature=0, logprobs=0)["choices"][0]
    stop = full["text"][len(full["text"]) // 2:][:1]
    if not stop.strip():
        stop = full["text"].strip()[-1:]
    cut = complete(model=family, prompt=text, max_tokens=16, temperature=0, logprobs=0,
                   stop=[stop])["choices"][0]
    assert cut["finish_reason"] == "stop" and stop not in cut["text"]
    check(cut, references[family].tokenizer)


@pytest.mark.parametrize("family", ["tiny-llama", "tiny-llama3"])  # the ones with a template
@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_chat_bytes_join_into_the_content(http, references, family, sample):
    body = {"model": family, "messages": [{"role": "user", "content": SAMPLES[sample]}],
            "max_tokens": 24, "temperature": 1.0, "seed": 3, "logprobs": True, "top_logprobs": 2}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    content, entries = choice["message"]["content"], choice["logprobs"]["content"]
    specials, names = special_tokens(references[family].tokenizer)
    assert b"".join(bytes(e["bytes"]) for e in entries if e["bytes"] is not None) == content.encode()
    assert "".join(e["token"] for e in entries if e["bytes"] is not None) == content
    for entry in entries:
        if entry["bytes"] is None:
            assert entry["token"] in names.values()
        else:
            assert bytes(entry["bytes"]) == entry["token"].encode()
