"""The full-vocabulary body, relayed: the response's text around its arrays
(serve_app.fullvocab.response), each array's chunks (or pieces of them) written by the
serializer pool, several at once, and sent in order as they come.

At most `window` calls of one response are in the pool or waiting to be sent: a slow client
holds production back, and one that leaves cancels what is under way.
"""

from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Protocol

from serve_app.engine.transient import cancel_call
from serve_app.fullvocab.compression import GzipJoiner, deflate_part


class Call(Awaitable, Protocol):
    """A call under way (a Serve DeploymentResponse, an asyncio task): awaited or cancelled."""

    def cancel(self) -> object: ...


async def in_order(calls: AsyncIterable[Call], window: int) -> AsyncIterator:
    """Each call's result in order; `calls` is lazy (each call starts when taken from it), so
    at most `window` are under way. Those not yet awaited are cancelled if the caller stops."""
    pending: deque[Call] = deque()
    try:
        async for call in calls:
            pending.append(call)
            if len(pending) == window:
                yield await oldest(pending)
        while pending:
            yield await oldest(pending)
    finally:
        for call in pending:
            call.cancel()


async def oldest(pending: deque[Call]):
    """The first call's result; it stays pending (to be cancelled) until it has one."""
    result = await pending[0]
    pending.popleft()
    return result


class Holding:
    """A call with the chunk it writes, kept until the call ends: Ray Serve sends a call after
    `remote()` returns, and a chunk's last reference must not go before its call reaches the
    pool (the streamed rows let go of each chunk once taken)."""

    def __init__(self, call: Call, chunk: object):
        self.call, self.chunk = call, chunk

    def __await__(self):
        return self.call.__await__()

    def cancel(self) -> None:
        cancel_call(self.call)


async def started(chunks: AsyncIterable, write: Callable[[object], Call]) -> AsyncIterator[Call]:
    async for chunk in chunks:
        yield Holding(write(chunk), chunk)


async def full_vocab_body(parts: AsyncIterable[bytes | AsyncIterable], write: Callable[[object], Call],
                          window: int, gzip: bool) -> AsyncIterator[bytes]:
    """The body: text as it is, chunks (as they come) through `write` (a pool call giving
    bytes, or a DeflatedPart when `gzip`); with gzip, one member around it all."""
    joiner = GzipJoiner() if gzip else None
    async for part in parts:
        if isinstance(part, bytes):
            yield joiner.add(deflate_part(part)) if joiner else part
            continue
        async with aclosing(in_order(started(part, write), window)) as written:
            async for piece in written:
                yield joiner.add(piece) if joiner else piece
    if joiner:
        yield joiner.end()
