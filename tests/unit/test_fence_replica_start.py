"""The replica's self-check: the comparison of full-vocabulary rows with vLLM's own top-k."""

import numpy as np
import pytest

from serve_app.engine.vllm_fence.replica_start import full_vocab_mismatch
from tests.unit.fakes import full_vocab_rows, positions


def rows_and_top_k(logits: np.ndarray, prompt: list[int], k: int):
    """Full-vocabulary rows of `logits` (row r predicts prompt[r + 1]) and their top-k as vLLM
    returns it."""
    rows = full_vocab_rows(logits - np.log(np.exp(logits).sum(axis=1, keepdims=True)), prompt)
    top = np.argsort(-rows.logprobs, axis=1)[:, :k]
    scored = [[(t, rows.actual_logprobs[r], rows.actual_ranks[r])]
              + [(i, rows.logprobs[r, i], j + 1) for j, i in enumerate(top[r])]
              for r, t in enumerate(prompt[1:])]
    return rows, positions(None, *scored)


def test_the_self_check_passes_rows_that_equal_vllms_top_k():
    rows, top_k = rows_and_top_k(np.random.default_rng(0).normal(size=(4, 10)), [1, 2, 3, 4, 5], 3)
    assert full_vocab_mismatch([rows.positions(0, 2), rows.positions(2, 4)], top_k, 3) is None


@pytest.mark.parametrize("spoil, problem", [
    (lambda rows: rows.logprobs.__setitem__((1, 0), rows.logprobs[1, 0] + 1), "not a distribution"),
    (lambda rows: rows.actual_ranks.__setitem__(2, 9), "prompt token's logprob or rank"),
    (lambda rows: rows.logprobs.__setitem__(slice(None), rows.logprobs[:, ::-1].copy()), "differ"),
])
def test_the_self_check_names_a_row_that_differs(spoil, problem):
    rows, top_k = rows_and_top_k(np.random.default_rng(1).normal(size=(4, 10)), [1, 2, 3, 4, 5], 3)
    spoil(rows)
    assert problem in full_vocab_mismatch([rows], top_k, 3)
    assert "4 rows for 3" in full_vocab_mismatch([rows], positions(*[None] * 4), 3)
