"""One prompt's full-vocabulary rows as its model replica computes them, window by window
(serve_app.engine.windows): the body streams each window's chunks as it comes (again for
each later choice of the prompt) and shapes the rest of the choice once the last one came."""

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass

from serve_app.engine.wire import EngineResult, FullVocabParts


class StreamedRows:
    def __init__(self, windows: AsyncIterator[EngineResult]):
        self.source = windows
        self.windows: list[EngineResult] = []
        self.ended = False

    async def first(self) -> None:
        """Waits for the first window: a refusal until then is still the client's HTTP error."""
        if not self.windows and not self.ended:
            await self.next()

    async def next(self) -> None:
        try:
            self.windows.append(await anext(self.source))
        except StopAsyncIteration:
            self.ended = True

    async def parts(self, last_use: bool) -> AsyncIterator[FullVocabParts]:
        """Each window's parts as they come; on the `last_use`, each window's chunks are let
        go once taken (their rows leave Ray's object store when written)."""
        taken = 0
        while taken < len(self.windows) or not self.ended:
            if taken == len(self.windows):
                await self.next()
                continue
            window = self.windows[taken]
            if last_use:
                self.windows[taken] = without_chunks(window)
            taken += 1
            yield window.full_vocab

    def result(self) -> EngineResult:
        """The prompt's result (its chunks as far as kept), once every window came."""
        return self.windows[-1].after(self.windows[:-1])

    async def close(self) -> None:
        """Stops the replica's computation if it has not ended."""
        await self.source.aclose()


def without_chunks(window: EngineResult) -> EngineResult:
    return dataclasses.replace(window, full_vocab=dataclasses.replace(window.full_vocab, chunks=[], sizes=[]))


@dataclass(frozen=True)
class RowsPiece:
    """Positions [start, stop) of a chunk of rows: what a pool worker writes as JSON in one call.
    A chunk's JSON is many times its rows (70 bytes an entry against 4), so the JSON is
    written in pieces smaller than the chunks the replica stores: what a worker builds and the
    ingress holds per call is a piece's."""

    rows: object  # the chunk as the replica stored it
    start: int
    stop: int


async def pieces_of(parts: AsyncIterator[FullVocabParts], positions: int) -> AsyncIterator[RowsPiece]:
    """Each window's chunks in pieces of at most `positions` positions, in order."""
    async for window in parts:
        for chunk, size in zip(window.chunks, window.sizes, strict=True):
            for start in range(0, size, positions):
                yield RowsPiece(chunk, start, min(start + positions, size))
