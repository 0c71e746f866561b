"""The Python examples of the public API documents our clients are written against, run with
the official openai SDK. Each keeps its document's code; only the base URL and the model name are changed (the
tokenizer name too, since a tokenizer is named by its model). The asserts check the values
they print against the reference."""

import ast
import re

import numpy as np
import pytest
from openai import OpenAI

from serve_app.store.model_store import embedded_model_path
from tests.e2e.conftest import MODEL
from tests.e2e.reference import TOLERANCE, assert_rank, assert_top_texts

# A line of the prompt_logprobs example: rank, logprob to three decimals, the token's repr.
ENTRY_LINE = re.compile(r"  rank=([ \d]{2,})  logprob=([-+]\d+\.\d{3})  ('.*'|\".*\")")


@pytest.fixture(scope="module")
def client(base_url):
    return OpenAI(base_url=f"{base_url}/v1", api_key="unused")


def test_engy_score_a_span(client, reference, capsys):
    # 000: "Score a span"
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_path(MODEL))

    prefix = "The capital of France is"
    span = " Paris."

    ids = tokenizer.encode(prefix + span)
    span_len = len(tokenizer.encode(span, add_special_tokens=False))

    response = client.completions.create(
        model=MODEL,
        prompt=ids,
        max_tokens=1,
        temperature=0,
        extra_body={"logprob_start_len": len(ids) - span_len},
    )

    logprobs = response.choices[0].logprobs
    print(sum(x for x in logprobs.token_logprobs if x is not None))

    rows = reference.prompt_rows(ids)
    expected = sum(rows[p][ids[p]] for p in range(len(ids) - span_len, len(ids)))
    assert float(capsys.readouterr().out) == pytest.approx(expected, abs=TOLERANCE * span_len)
    assert len(logprobs.token_logprobs) == span_len


def test_acs_prompt_logprobs(client, reference, capsys):
    # 002: "prompt_logprobs"
    resp = client.completions.create(
        model=MODEL,
        prompt="The capital of France is",
        max_tokens=1,
        extra_body={"prompt_logprobs": 5},
    )

    for i, choices in enumerate(resp.choices[0].prompt_logprobs[:3]):
        if choices is None:
            continue
        print(f"position {i}:")
        for token_id, info in choices.items():
            print(f"  rank={info['rank']:>2}  logprob={info['logprob']:+.3f}  {info['decoded_token']!r}")

    # Each position's lines under its heading: every entry's rank and logprob bound to its token.
    shown = printed_positions(capsys.readouterr().out)
    ids = reference.tokenizer.encode("The capital of France is")
    rows = reference.prompt_rows(ids)
    assert list(shown) == [1, 2]
    for position, entries in shown.items():
        row, token_id = rows[position], ids[position]
        expected = [int(t) for t in np.argsort(-row)[:5]]
        if token_id not in expected:
            expected.append(token_id)
        by_rank = sorted(entries)
        assert [text for _, _, text in by_rank] == [reference.tokenizer.decode([t]) for t in expected]
        for (rank, logprob, _), expected_id in zip(by_rank, expected, strict=True):
            assert_rank(row, expected_id, rank)
            assert abs(logprob - row[expected_id]) <= 5e-4 + TOLERANCE  # printed to 3 decimals


def printed_positions(printed: str) -> dict[int, list[tuple[int, float, str]]]:
    """{position: [(rank, logprob, token)]} of what the prompt_logprobs example printed, every
    line read whole, in its position's block."""
    positions: dict[int, list[tuple[int, float, str]]] = {}
    for line in printed.splitlines():
        if heading := re.fullmatch(r"position (\d+):", line):
            positions[int(heading[1])] = []
        else:
            entry = ENTRY_LINE.fullmatch(line)
            assert entry and positions, line
            rank, logprob, token = int(entry[1]), float(entry[2]), ast.literal_eval(entry[3])
            positions[list(positions)[-1]].append((rank, logprob, token))
    return positions


def test_acs_logprobs(client, reference, capsys):
    # 003 and 004: "logprobs"
    resp = client.completions.create(
        model=MODEL,
        prompt="The capital of France is",
        max_tokens=1,
        logprobs=5,
    )
    choice = resp.choices[0]
    print(choice.text, choice.logprobs.top_logprobs[0])  # {' a': -1.74, ' Paris': -1.99, ...}

    # What the line shows: the sampled text, then the five likeliest next tokens (six when
    # the sample is not among them) with the reference's logprobs.
    printed = capsys.readouterr().out.removesuffix("\n")
    assert printed.startswith(choice.text + " ")
    shown = ast.literal_eval(printed[len(choice.text) + 1:])
    row = reference.log_softmax(reference.tokenizer.encode("The capital of France is"))[-1]
    assert_top_texts(shown, reference.tokenizer, row, 5, choice.logprobs.token_ids[0])
    assert choice.logprobs.text_offset == [0]


def test_acs_full_distribution_over_generated_text(client, reference):
    # 002: "Full distribution over generated text" (`prompt` is left to the reader there)
    prompt = "The capital of France is"

    gen = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=64, seed=7
    )
    full_text = prompt + gen.choices[0].text

    rescored = client.completions.create(
        model=MODEL,
        prompt=full_text,
        max_tokens=1,
        extra_body={"prompt_logprobs": -1},
    )
    # rescored.choices[0].prompt_logprobs[i] is now the full ~128k-entry
    # distribution at position i — including every generated position.

    ids = reference.tokenizer.encode(full_text)
    rows = reference.prompt_rows(ids)
    positions = rescored.choices[0].prompt_logprobs
    assert len(positions) == len(ids)
    for p in (1, len(ids) // 2, len(ids) - 1):
        assert len(positions[p]) == rows.shape[1]
        logprobs = {int(t): e["logprob"] for t, e in positions[p].items()}
        some = list(logprobs)[::97]
        np.testing.assert_allclose([logprobs[t] for t in some], rows[p][some], atol=TOLERANCE)
