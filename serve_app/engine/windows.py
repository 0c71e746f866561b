"""Prompt windows: a prompt's rows computed W positions at a time, each window an engine
request that reads the KV cache of the windows before it. Full-vocabulary rows can then leave
as soon as their window ends instead of after the whole prompt (vLLM returns a prompt's rows
only when its prefill ends), and no process holds more than a window of [positions x
vocabulary]; and a background request's prefill holds the engine for one window at a time
(serve_app.engine.background).

Window k shows positions kW + 1 .. (k + 1)W: its prompt ends at its last position, and it may
read the first kW tokens from the cache, whole blocks when W is a multiple of the KV block.
The first window ends at the first block's end instead, so that the first rows leave after
one block's computation (a window reads whole blocks only: none shorter can be cut before it).
Only the last window, the whole prompt, generates what the request asks.
"""

import dataclasses

from serve_app.engine.wire import EngineRequest, EngineResult, PositionLogprobs

# Windows a replica may compute before its caller takes them (serve_app.front.replica_router):
# the next is ready when the pool has written one, and two windows of rows wait in Ray's
# object store, not the whole prompt's.
RUN_AHEAD = 2

# What a window before the last generates: one greedy token, as cheap as it gets.
ROWS_ONLY = {"max_tokens": 1, "n": 1, "temperature": 0.0, "top_p": 1.0, "seed": None, "stop": [],
             "presence_penalty": 0.0, "frequency_penalty": 0.0, "logit_bias": None}


def window_starts(first: int, last: int, window: int, block: int) -> list[int]:
    """The first position of each window showing positions `first`..`last`: the first window
    ends at the first multiple of `block` from `first` on, the others at multiples of `window`."""
    first_end = -(-first // block) * block
    aligned = first_end // window * window + window + 1  # the first multiple after it
    split = [first_end + 1] if first_end + 1 < min(aligned, last + 1) else []
    return [first, *split, *range(aligned, last + 1, window)]


def prompt_windows(request: EngineRequest, window: int, block: int) -> list[EngineRequest]:
    """The engine requests that compute a request's prompt rows, in order."""
    tokens, first = request.prompt_token_ids, max(request.prompt_rows_from, 1)
    last = len(tokens) - 1  # the last position with a row
    if last <= first:
        return [dataclasses.replace(request, prompt_rows_from=first)]
    starts = window_starts(first, last, window, block)
    ends = [start - 1 for start in starts[1:]]
    before_last = [dataclasses.replace(request, prompt_token_ids=tokens[:end + 1], prompt_rows_from=start,
                                       **ROWS_ONLY) for start, end in zip(starts, ends)]
    return [*before_last, dataclasses.replace(request, prompt_rows_from=starts[-1])]


def next_window(windows: list[EngineRequest], whole: bool) -> tuple[EngineRequest, list[EngineRequest]]:
    """The next engine request of a prompt's windows, and the windows left after it: the
    first, or with `whole` all of them as one (the last's request, from the first's rows on)."""
    if not whole or len(windows) == 1:
        return windows[0], windows[1:]
    return dataclasses.replace(windows[-1], prompt_rows_from=windows[0].prompt_rows_from), []


def joined_windows(windows: list[EngineRequest], results: list[EngineResult]) -> EngineResult:
    """A top-k request's result from its windows' (in order), as one engine request returns
    it: the first window's positions, then each later one's from its first row on; what the
    last generated; the first's queue time."""
    if len(results) == 1:
        return results[0]
    starts = [0] + [window.prompt_rows_from for window in windows[1:]]
    rows = PositionLogprobs.spliced([result.prompt_logprobs for result in results], starts)
    return dataclasses.replace(results[-1], prompt_logprobs=rows, queue_time_s=results[0].queue_time_s)


def stream_items_ahead(window: int, chunk_positions: int) -> int:
    """Items of `generate_full_vocab`'s stream in RUN_AHEAD windows of `window` positions at
    most: each window's result, then its chunks of rows (one more where two engine steps
    split its prefill)."""
    return RUN_AHEAD * (2 + -(-window // chunk_positions))
