"""A prompt's full-vocabulary rows as the ingress streams them, window by window."""

import asyncio

import numpy as np

from serve_app.engine.wire import EngineResult
from serve_app.fullvocab.streamed import RowsPiece, StreamedRows, pieces_of
from tests.unit.fakes import each, full_vocab_parts, in_windows, streamed
from tests.unit.test_completions import GENERATED

PROMPT = [0, 1, 2, 3, 4]
DISTRIBUTIONS = np.log(np.random.default_rng(1).dirichlet(np.ones(6), len(PROMPT) - 1)).astype(np.float32)
RESULT = EngineResult(np.array(PROMPT, np.int32), None, [GENERATED],
                      full_vocab_parts(DISTRIBUTIONS, PROMPT, k=2, chunk_positions=1))


def test_each_choice_gets_every_chunk_and_the_last_lets_them_go():
    async def scenario():
        rows = streamed(in_windows(RESULT, [2, 1, 1]))
        await rows.first()
        assert len(rows.windows) == 1  # nothing more asked of the replica yet
        first_choice = [piece async for piece in pieces_of(rows.parts(last_use=False), 1)]
        second_choice = [piece async for piece in pieces_of(rows.parts(last_use=True), 1)]
        assert first_choice == second_choice == [RowsPiece(chunk, 0, 1) for chunk in RESULT.full_vocab.chunks]
        joined = rows.result()
        assert joined.full_vocab.chunks == []  # let go: written, they leave the object store
        assert joined.completions == RESULT.completions
        for name in ("token_ids", "logprobs", "actual_logprobs", "actual_ranks"):
            expected = getattr(RESULT.full_vocab.top_k, name)
            assert np.array_equal(getattr(joined.full_vocab.top_k, name), expected)
    asyncio.run(scenario())


def test_chunks_are_cut_in_pieces_of_whole_positions():
    parts = full_vocab_parts(DISTRIBUTIONS, PROMPT, k=2, chunk_positions=3)  # chunks of 3 and 1

    async def pieces(positions: int) -> list[tuple[int, int, int]]:
        chunks = [id(chunk) for chunk in parts.chunks]
        return [(chunks.index(id(piece.rows)), piece.start, piece.stop)
                async for piece in pieces_of(each([parts]), positions)]
    assert asyncio.run(pieces(2)) == [(0, 0, 2), (0, 2, 3), (1, 0, 1)]
    assert asyncio.run(pieces(16)) == [(0, 0, 3), (1, 0, 1)]


def test_closing_stops_the_replicas_windows():
    stopped = []

    async def windows():
        try:
            for window in in_windows(RESULT, [1, 1, 1, 1]):
                yield window
        finally:
            stopped.append(True)

    async def scenario():
        rows = StreamedRows(windows())
        await rows.first()
        await rows.close()  # the client left after the first window
    asyncio.run(scenario())
    assert stopped == [True]
