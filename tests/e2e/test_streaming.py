"""stream: true: server-sent events that add up to the non-streamed answer."""

import pytest

from tests.e2e.conftest import MODEL
from tests.e2e.reference import TOLERANCE
from tests.e2e.sse import stream_events

TEXT = "The capital of France is"


def events(http, **fields) -> list:
    return stream_events(http, "/v1/completions", {"model": MODEL, "prompt": TEXT, "stream": True,
                                                   **fields})


def joined(chunks: list, index: int) -> dict:
    mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == index]
    logprobs = [c["logprobs"] for c in mine if c["logprobs"]]
    return {
        "text": "".join(c["text"] for c in mine),
        "finish_reason": mine[-1]["finish_reason"],
        "token_logprobs": [lp for part in logprobs for lp in part["token_logprobs"]],
        "text_offset": [o for part in logprobs for o in part["text_offset"]],
    }


def test_a_stream_adds_up_to_the_plain_answer(http, complete):
    plain = complete(prompt=TEXT, max_tokens=8, temperature=0, logprobs=2)["choices"][0]
    streamed = joined(events(http, max_tokens=8, temperature=0, logprobs=2), 0)
    assert streamed["text"] == plain["text"]
    assert streamed["finish_reason"] == plain["finish_reason"]
    assert streamed["text_offset"] == plain["logprobs"]["text_offset"]
    assert streamed["token_logprobs"] == pytest.approx(plain["logprobs"]["token_logprobs"],
                                                       abs=TOLERANCE)


def test_batches_and_n_interleave_by_index(http, complete):
    chunks = events(http, prompt=[TEXT, "x = 1"], n=2, max_tokens=4, seed=9,
                    stream_options={"include_usage": True})
    assert {c["choices"][0]["index"] for c in chunks if c["choices"]} == {0, 1, 2, 3}
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens"] > 0
    plain = complete(prompt=[TEXT, "x = 1"], n=2, max_tokens=4, seed=9)
    assert usage["usage"]["completion_tokens"] == plain["usage"]["completion_tokens"]
    assert {joined(chunks, i)["text"] for i in range(4)} == {c["text"] for c in plain["choices"]}


def test_openai_sdk_streams(base_url):
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key="unused")
    parts = client.completions.create(model=MODEL, prompt=TEXT, max_tokens=5, temperature=0,
                                      stream=True)
    text = "".join(part.choices[0].text for part in parts if part.choices)
    plain = client.completions.create(model=MODEL, prompt=TEXT, max_tokens=5, temperature=0)
    assert text == plain.choices[0].text
