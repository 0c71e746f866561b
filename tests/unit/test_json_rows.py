import numpy as np
import orjson
import pytest

from serve_app.engine.wire import FullVocabRows
from serve_app.fullvocab.json_rows import EntryFragments, chunk_json, piece_positions, position_json
from tests.unit.fakes import full_vocab_rows

TOKENS = ["a", " b", '"q"', "\\", "é€", "", "\n", "z"]


def distributions(seed: int, rows: int) -> np.ndarray:
    logits = np.random.default_rng(seed).normal(0, 3, (rows, len(TOKENS))).astype(np.float32)
    return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))


def rows_of(seed: int, rows: int) -> FullVocabRows:
    return full_vocab_rows(distributions(seed, rows), [0] * (rows + 1))


def naive(token_ids, logprobs) -> dict:
    return {str(t): {"logprob": max(float(lp), -9999.0), "rank": r + 1, "decoded_token": TOKENS[t]}
            for r, (t, lp) in enumerate(zip(token_ids.tolist(), logprobs.tolist()))}


def vllm_order(ranked_ids: list[int], prompt_token: int) -> list[str]:
    """vLLM's keys: the prompt token, then the others by rank."""
    return [str(t) for t in [prompt_token, *(t for t in ranked_ids if t != prompt_token)]]


@pytest.mark.parametrize("prompt_token", [0, 4, 7])
def test_a_position_is_the_json_of_its_entries_the_prompt_token_first_then_by_rank(prompt_token):
    rows = rows_of(0, 1)
    parsed = orjson.loads(position_json(rows.logprobs[0], prompt_token, EntryFragments(TOKENS)))
    ranked = rows.ranked()
    expected = naive(ranked.token_ids[0], ranked.logprobs[0])
    assert list(parsed) == vllm_order(ranked.token_ids[0].tolist(), prompt_token)
    assert parsed.keys() == expected.keys()
    for key, entry in expected.items():
        assert parsed[key]["rank"] == entry["rank"]
        assert parsed[key]["decoded_token"] == entry["decoded_token"]
        assert parsed[key]["logprob"] == pytest.approx(entry["logprob"], rel=1e-6)


def test_minus_infinity_is_written_as_minus_9999():
    logprobs = np.array([0.0] + [-np.inf] * (len(TOKENS) - 1), np.float32)
    parsed = orjson.loads(position_json(logprobs, 0, EntryFragments(TOKENS)))
    assert parsed["7"]["logprob"] == -9999.0


def test_chunks_follow_null_in_the_prompt_logprobs_array():
    prompt = [1, 0, 3, 6, 2, 5]
    rows = full_vocab_rows(distributions(1, 5), prompt)
    fragments = EntryFragments(TOKENS)
    chunks = [chunk_json(rows.positions(start, start + 2), fragments) for start in (0, 2, 4)]
    parsed = orjson.loads(b"[null" + b"".join(chunks) + b"]")
    assert parsed[0] is None and len(parsed) == 6
    for position, token in enumerate(prompt[1:], start=1):
        by_rank = np.argsort(-rows.logprobs[position - 1]).tolist()
        assert list(parsed[position]) == vllm_order(by_rank, token)
        assert parsed[position][str(token)]["rank"] == by_rank.index(token) + 1
    assert [parsed[3][str(t)]["logprob"] for t in range(len(TOKENS))] == pytest.approx(
        rows.logprobs[2].tolist(), rel=1e-6)


@pytest.mark.parametrize("k", [None, 0, 1, 3, len(TOKENS)])
def test_ranked_rows_are_each_rows_top_k_by_descending_logprob(k):
    rows = rows_of(3, 4)
    ranked = rows.ranked(k)
    columns = len(TOKENS) if k is None else k
    expected = np.argsort(-rows.logprobs, axis=1)[:, :columns]
    assert ranked.token_ids.dtype == np.int32 and ranked.token_ids.tolist() == expected.tolist()
    assert ranked.logprobs.tolist() == np.take_along_axis(rows.logprobs, expected, 1).tolist()


def test_top_k_view_matches_the_top_k_path():
    by_rank = rows_of(2, 3).ranked().token_ids
    prompt = [0, int(by_rank[0, 5]), int(by_rank[1, 0]), int(by_rank[2, 1])]
    rows = full_vocab_rows(distributions(2, 3), prompt)
    view = rows.ranked(2).top_k_positions(prompt, k=2)
    assert len(view) == 4 and not view.is_scored(0)
    assert view.actual(1)[0] == prompt[1] and view.actual(1)[2] == 6
    assert view.actual(2)[2] == 1 and view.actual(3)[2] == 2
    assert view.actual(1)[1] == pytest.approx(float(rows.logprobs[0, prompt[1]]))
    ids, _, ranks = view.top(3, 2)
    assert ids.tolist() == by_rank[2, :2].tolist() and ranks.tolist() == [1, 2]


def test_a_piece_is_whole_positions_of_about_the_bytes_asked():
    assert piece_positions(49_152, 8 << 20) == 2  # SmolLM2: 3.4 MB a position
    assert piece_positions(128_256, 8 << 20) == 1  # never less than one
    assert piece_positions(100, 70_000) == 10
