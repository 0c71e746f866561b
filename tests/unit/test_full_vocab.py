import numpy as np
import orjson
import pytest

from serve_app.full_vocab import EntryFragments, chunk_json, position_json
from serve_app.scoring import FullVocabRows
from tests.unit.fakes import full_vocab_rows

TOKENS = ["a", " b", '"q"', "\\", "é€", "", "\n", "z"]


def distributions(seed: int, rows: int) -> np.ndarray:
    logits = np.random.default_rng(seed).normal(0, 3, (rows, len(TOKENS))).astype(np.float32)
    return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))


def sorted_rows(seed: int, rows: int) -> FullVocabRows:
    return full_vocab_rows(distributions(seed, rows), [0] * (rows + 1))


def naive(token_ids, logprobs) -> dict:
    return {str(t): {"logprob": max(float(lp), -9999.0), "rank": r + 1, "decoded_token": TOKENS[t]}
            for r, (t, lp) in enumerate(zip(token_ids.tolist(), logprobs.tolist()))}


def test_a_position_is_the_json_of_its_entries_in_rank_order():
    rows = sorted_rows(0, 1)
    text = position_json(rows.token_ids[0], rows.logprobs[0], EntryFragments(TOKENS))
    parsed = orjson.loads(text)
    expected = naive(rows.token_ids[0], rows.logprobs[0])
    assert list(parsed) == list(expected)
    for key, entry in expected.items():
        assert parsed[key]["rank"] == entry["rank"]
        assert parsed[key]["decoded_token"] == entry["decoded_token"]
        assert parsed[key]["logprob"] == pytest.approx(entry["logprob"], rel=1e-6)


def test_minus_infinity_is_written_as_minus_9999():
    token_ids = np.arange(len(TOKENS), dtype=np.int32)
    logprobs = np.array([0.0] + [-np.inf] * (len(TOKENS) - 1), np.float32)
    parsed = orjson.loads(position_json(token_ids, logprobs, EntryFragments(TOKENS)))
    assert parsed["7"]["logprob"] == -9999.0


def test_chunks_follow_null_in_the_prompt_logprobs_array():
    rows = sorted_rows(1, 5)
    fragments = EntryFragments(TOKENS)
    chunks = [chunk_json(rows.positions(start, start + 2), fragments) for start in (0, 2, 4)]
    parsed = orjson.loads(b"[null" + b"".join(chunks) + b"]")
    assert parsed[0] is None and len(parsed) == 6
    assert [int(k) for k in parsed[3]] == rows.token_ids[2].tolist()


def test_top_k_view_matches_the_top_k_path():
    by_rank = sorted_rows(2, 3).token_ids
    prompt = [0, int(by_rank[0, 5]), int(by_rank[1, 0]), int(by_rank[2, 1])]
    rows = full_vocab_rows(distributions(2, 3), prompt)
    view = rows.top_k_positions(prompt, k=2)
    assert len(view) == 4 and not view.is_scored(0)
    assert view.actual(1)[0] == prompt[1] and view.actual(1)[2] == 6
    assert view.actual(2)[2] == 1 and view.actual(3)[2] == 2
    assert view.actual(1)[1] == pytest.approx(float(rows.logprobs[0, 5]))
    ids, _, ranks = view.top(3, 2)
    assert ids.tolist() == rows.token_ids[2, :2].tolist() and ranks.tolist() == [1, 2]
