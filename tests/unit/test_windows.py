"""Full-vocabulary windows: which engine requests compute a prompt's rows, in what order."""

import dataclasses

import numpy as np
import pytest

from serve_app.config import ModelConfig
from serve_app.engine.windows import (
    ROWS_ONLY,
    RUN_AHEAD,
    joined_windows,
    next_window,
    prompt_windows,
    stream_items_ahead,
    window_starts,
)
from serve_app.engine.wire import Completion, EngineRequest, EngineResult, PromptRows

REQUEST = EngineRequest(prompt_token_ids=list(range(100, 111)), max_tokens=5, temperature=0.7, top_p=0.9,
                        n=3, seed=4, stop=["x"], logprobs=2, prompt_logprobs=-1, tenant="t",
                        priority=0)


@pytest.mark.parametrize("first, last, window, starts", [
    (1, 10, 4, [1, 5, 9]), (1, 8, 4, [1, 5]), (1, 4, 4, [1]), (3, 10, 4, [3, 5, 9]), (5, 12, 4, [5, 9]),
])
def test_windows_start_after_multiples_of_the_window(first, last, window, starts):
    assert window_starts(first, last, window, block=window) == starts


@pytest.mark.parametrize("first, last, starts", [
    (1, 20, [1, 3, 9, 17]), (3, 20, [3, 5, 9, 17]), (1, 5, [1, 3]), (2, 2, [2]), (1, 2, [1]),
    (7, 20, [7, 9, 17]),  # the first block's end is a window's
    (9, 12, [9, 11]),
])
def test_the_first_window_ends_at_the_first_blocks_end(first, last, starts):
    """Windows of 8 positions on blocks of 2: the first rows leave after one block."""
    assert window_starts(first, last, window=8, block=2) == starts


def test_each_window_shows_its_positions_reading_the_ones_before():
    windows = prompt_windows(REQUEST, 4, 4)  # rows of positions 1..10
    assert [len(w.prompt_token_ids) for w in windows] == [5, 9, 11]
    assert [w.prompt_rows_from for w in windows] == [1, 5, 9]
    # each ends at its last position and may read the tokens before its first from the cache
    assert [w.cache_readable_tokens() for w in windows] == [0, 4, 8]
    assert [w.first_prompt_row() for w in windows] == [0, 4, 8]
    assert all(w.prompt_token_ids == REQUEST.prompt_token_ids[:len(w.prompt_token_ids)] for w in windows)


def test_on_blocks_smaller_than_the_window_the_first_window_is_one_block():
    windows = prompt_windows(REQUEST, 4, 2)  # rows of positions 1..10 on blocks of 2
    assert [w.prompt_rows_from for w in windows] == [1, 3, 5, 9]
    assert [w.cache_readable_tokens() for w in windows] == [0, 2, 4, 8]


def test_only_the_last_window_generates_what_was_asked():
    *before, last = prompt_windows(REQUEST, 4, 4)
    for window in before:
        assert {name: getattr(window, name) for name in ROWS_ONLY} == ROWS_ONLY
        assert (window.logprobs, window.prompt_logprobs) == (2, -1)  # the echo's top-k of its rows
    assert (last.max_tokens, last.n, last.temperature, last.seed, last.stop) == (5, 3, 0.7, 4, ["x"])


@pytest.mark.parametrize("length", [1, 2, 5])
def test_a_prompt_within_one_window_is_one_request(length):
    request = EngineRequest(prompt_token_ids=list(range(length)), max_tokens=1, temperature=0.0, top_p=1.0,
                            prompt_logprobs=-1, tenant="t", priority=0)
    (window,) = prompt_windows(request, 4, 4)
    assert window.prompt_token_ids == request.prompt_token_ids and window.cache_readable_tokens() == 0


@pytest.mark.parametrize("window, block, largest", [(128, None, 128), (64, None, 128), (256, 16, 256),
                                                    (8, 32, 32)])
def test_the_largest_window_is_the_configured_one_or_one_kv_block(window, block, largest):
    model = ModelConfig(name="m", path="/models/m", full_vocab_window=window, kv_block_size=block)
    assert model.largest_full_vocab_window() == largest


@pytest.mark.parametrize("window, chunk, items", [(128, 16, 10), (128, 8, 18), (130, 16, 11), (16, 16, 3)])
def test_the_run_ahead_holds_each_windows_result_and_chunks_split_in_two_steps(window, chunk, items):
    # A window's items: its result, its chunks, and one more chunk where two steps split it.
    assert stream_items_ahead(window, chunk) == RUN_AHEAD * items


def engine_rows(prompt: list[int], first: int, width: int) -> EngineResult:
    """What the engine returns for a window showing positions `first`.. of `prompt`: zero
    rows before them (the buffer of positions it read from the cache), entries that name
    each position."""
    rows = np.array([[0] * width if position < first else [position * 10 + column for column in range(width)]
                     for position in range(1, len(prompt))], np.int32)
    positions = PromptRows(rows, rows.astype(np.float32), rows[:, 0].astype(np.int64)).as_positions()
    completion = Completion(index=0, token_ids=np.array([first], np.int32), text=str(first),
                            finish_reason="length", logprobs=None)
    return EngineResult(prompt_token_ids=np.array(prompt), prompt_logprobs=positions,
                        completions=[completion], queue_time_s=float(first))


def test_joined_windows_return_the_rows_of_one_request():
    request = EngineRequest(prompt_token_ids=list(range(100, 111)), max_tokens=1, temperature=0.0, top_p=1.0,
                            prompt_logprobs=2, tenant="t", priority=1)
    windows = prompt_windows(request, 4, 4)  # positions 1..4, 5..8, 9..10
    results = [engine_rows(w.prompt_token_ids, w.prompt_rows_from, 3) for w in windows]
    joined = joined_windows(windows, results)
    whole = engine_rows(request.prompt_token_ids, 1, 3).prompt_logprobs
    assert len(joined.prompt_logprobs) == len(request.prompt_token_ids)
    for name in ("offsets", "token_ids", "logprobs", "ranks"):
        assert np.array_equal(getattr(joined.prompt_logprobs, name), getattr(whole, name)), name
    assert joined.completions == results[-1].completions and joined.queue_time_s == 1.0


def test_a_span_s_windows_keep_the_first_window_s_unshown_positions():
    request = EngineRequest(prompt_token_ids=list(range(100, 111)), max_tokens=1, temperature=0.0, top_p=1.0,
                            prompt_logprobs=1, prompt_rows_from=6, tenant="t", priority=1)
    windows = prompt_windows(request, 4, 4)  # positions 6..8, 9..10
    results = [engine_rows(w.prompt_token_ids, w.prompt_rows_from, 2) for w in windows]
    joined = joined_windows(windows, results)
    assert np.array_equal(joined.prompt_logprobs.token_ids,
                          engine_rows(request.prompt_token_ids, 6, 2).prompt_logprobs.token_ids)


def test_the_windows_left_go_as_one_request_that_reads_the_ones_computed():
    request = EngineRequest(prompt_token_ids=list(range(100, 111)), max_tokens=3, temperature=0.0, top_p=1.0,
                            prompt_logprobs=2, tenant="t", priority=1)
    windows = prompt_windows(request, 4, 4)  # positions 1..4, 5..8, 9..10
    first, left = next_window(windows, whole=False)
    assert first == windows[0] and left == windows[1:]
    rest, left = next_window(left, whole=True)
    assert left == [] and rest == dataclasses.replace(request, prompt_rows_from=5)
    assert rest.cache_readable_tokens() == 4  # the first window's tokens, from the cache
    results = [engine_rows(w.prompt_token_ids, w.prompt_rows_from, 3) for w in (first, rest)]
    joined = joined_windows([first, rest], results)
    whole = engine_rows(request.prompt_token_ids, 1, 3).prompt_logprobs
    assert np.array_equal(joined.prompt_logprobs.token_ids, whole.token_ids)
    assert next_window(windows[2:], whole=True) == (windows[2], [])
