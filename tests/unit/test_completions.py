import numpy as np
import orjson
import pytest

from serve_app.api import admission, completions
from serve_app.engine.wire import Completion, EngineResult
from serve_app.fullvocab.json_rows import EntryFragments
from serve_app.fullvocab.response import json_parts
from tests.unit.fakes import full_vocab_parts, in_windows, positions, streamed
from tests.unit.test_admission import CALLER, CAPS, VOCAB, admit
from tests.unit.test_relay import relayed

PROMPT_ENTRIES = positions(
    None,
    [(1, -2.0, 3), (7, -0.5, 1), (8, -1.0, 2)],           # 'b' ranks 3rd: appended
    [(2, -0.25, 1), (2, -0.25, 1), (0, -float("inf"), 2)],  # 'c' is the top token
)
GENERATED = Completion(
    index=0, token_ids=np.array([4, 5], np.int32), text="é€", finish_reason="length",
    logprobs=positions([(4, -0.5, 1), (4, -0.5, 1), (3, -3.0, 2)],
                       [(5, -4.0, 9), (6, -0.1, 1), (7, -0.2, 2)]),
)
RESULT = EngineResult(prompt_token_ids=np.array([0, 1, 2], np.int32),
                      prompt_logprobs=PROMPT_ENTRIES, completions=[GENERATED])


def shape(**fields) -> dict:
    body, prompts = admit(**fields)
    return completions.completion_response("m", prompts, [RESULT], body, VOCAB)


def test_logprobs_k_of_generated_tokens():
    logprobs = shape(logprobs=1)["choices"][0]["logprobs"]
    assert logprobs["tokens"] == ["é", "€"]
    assert logprobs["text_offset"] == [0, 1]
    assert logprobs["token_logprobs"] == [-0.5, -4.0]
    # k entries when the sampled token is among them, k + 1 when it is not
    assert logprobs["top_logprobs"] == [{"é": -0.5}, {" ": pytest.approx(-0.1), "€": -4.0}]


def test_logprobs_zero_is_the_sampled_token_only():
    logprobs = shape(logprobs=0)["choices"][0]["logprobs"]
    assert logprobs["top_logprobs"] == [{"é": -0.5}, {"€": -4.0}]


def test_echo_scores_the_prompt_then_the_completion():
    choice = shape(echo=True, logprobs=1)["choices"][0]
    assert choice["text"] == "abcé€"
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == ["a", "b", "c", "é", "€"]
    assert logprobs["token_logprobs"][:3] == [None, -2.0, -0.25]
    assert logprobs["top_logprobs"][0] is None
    assert logprobs["top_logprobs"][1] == {"x": -0.5, "b": -2.0}
    assert logprobs["text_offset"] == [0, 1, 2, 3, 4]


def test_echo_without_logprobs_has_none():
    choice = shape(echo=True)["choices"][0]
    assert choice["text"] == "abcé€" and choice["logprobs"] is None


def test_span_scoring_returns_the_span_only():
    logprobs = shape(logprob_start_len=1)["choices"][0]["logprobs"]
    assert logprobs["tokens"] == ["b", "c"]
    assert logprobs["token_ids"] == [1, 2]
    assert logprobs["token_logprobs"] == [-2.0, -0.25]
    assert logprobs["text_offset"] == [1, 2]
    assert logprobs["top_logprobs"] is None


def test_prompt_logprobs_give_the_prompt_token_first_then_the_top_k_as_vllm_orders_them():
    prompt_logprobs = shape(prompt_logprobs=2)["choices"][0]["prompt_logprobs"]
    assert prompt_logprobs[0] is None
    assert list(prompt_logprobs[1].items()) == [
        ("1", {"logprob": -2.0, "rank": 3, "decoded_token": "b"}),  # outside the top 2
        ("7", {"logprob": -0.5, "rank": 1, "decoded_token": "x"}),
        ("8", {"logprob": -1.0, "rank": 2, "decoded_token": "y"}),
    ]
    assert list(prompt_logprobs[2].items()) == [  # the top token keeps the first place, once
        ("2", {"logprob": -0.25, "rank": 1, "decoded_token": "c"}),
        ("0", {"logprob": -9999.0, "rank": 2, "decoded_token": "a"}),
    ]


def test_minus_infinity_becomes_minus_9999():
    prompt_logprobs = shape(prompt_logprobs=2)["choices"][0]["prompt_logprobs"]
    assert prompt_logprobs[2]["0"]["logprob"] == -9999.0


def test_usage_and_choice_indices():
    body, prompts = admit(prompt=["ab", "abc"], n=2)
    double = EngineResult(RESULT.prompt_token_ids, None, [GENERATED, GENERATED])
    response = completions.completion_response("m", prompts, [double, double], body, VOCAB)
    assert [c["index"] for c in response["choices"]] == [0, 1, 2, 3]
    assert response["usage"] == {"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13}
    assert response["object"] == "text_completion" and response["model"] == "m"


def test_full_vocab_arrays_are_streamed_into_the_body():
    body, prompts = admit(prompt=["abc", "a"], prompt_logprobs=-1, echo=True, logprobs=1, n=2)
    results = []
    for prompt in prompts:
        rows = len(prompt.token_ids) - 1
        logprobs = np.tile(-np.arange(VOCAB.size, dtype=np.float32) - 1, (rows, 1))
        results.append(EngineResult(np.array(prompt.token_ids, np.int32), None, [GENERATED],
                                    full_vocab_parts(logprobs, prompt.token_ids, k=1, chunk_positions=1)))
    response = completions.completion_response("m", prompts, results, body, VOCAB)
    # the first prompt's two rows in two windows, the second's none
    windows = [streamed(in_windows(results[0], [1, 1])), streamed(in_windows(results[1], [0]))]
    head = {name: response[name] for name in ("id", "object", "created", "model")}
    parts = json_parts(head, windows, body.n,
                       lambda i, result: completions.prompt_choices(i, prompts[i], result, body, VOCAB),
                       lambda results: completions.completion_usage(prompts, results, body.n),
                       piece_positions=1)
    parsed = orjson.loads(relayed(parts, EntryFragments(VOCAB.strings), gzip=False))
    assert len(parsed["choices"]) == 4
    first, third = parsed["choices"][0], parsed["choices"][2]
    assert len(first["prompt_logprobs"]) == 3 and third["prompt_logprobs"] == [None]
    assert parsed["choices"][1]["prompt_logprobs"] == first["prompt_logprobs"]  # n = 2: again
    assert first["prompt_logprobs"][0] is None
    assert first["prompt_logprobs"][2]["2"] == {"logprob": -3.0, "rank": 3, "decoded_token": "c"}
    assert len(first["prompt_logprobs"][1]) == VOCAB.size
    # echo's logprobs come from the same arrays, joined over the windows: 'b' ranks second,
    # the top-1 is 'a'
    assert first["logprobs"]["token_logprobs"][:3] == [None, -2.0, -3.0]
    assert first["logprobs"]["top_logprobs"][1] == {"a": -1.0, "b": -2.0}
    # each choice's prompt_logprobs first, so that its rows leave before the prompt's end is
    # computed; the rest as in every other response
    assert list(parsed) == ["id", "object", "created", "model", "choices", "usage"]
    assert list(first) == ["index", "prompt_logprobs", "text", "logprobs", "finish_reason"]
    expected = {name: value for name, value in response.items() if name != "choices"}
    assert {name: value for name, value in parsed.items() if name != "choices"} == expected
    others = [{name: value for name, value in choice.items() if name != "prompt_logprobs"}
              for choice in parsed["choices"]]
    assert others == response["choices"]


@pytest.mark.parametrize("temperature", [0, 1e-6])
def test_greedy_choices_are_generated_once(temperature):
    body, (prompt,) = admit(n=2, temperature=temperature)
    assert admission.engine_request(prompt, body, CAPS, CALLER).n == 1
    response = completions.completion_response("m", [prompt], [RESULT], body, VOCAB)
    assert [c["index"] for c in response["choices"]] == [0, 1]
    assert response["usage"]["completion_tokens"] == 4
