"""The full-vocabulary relay: chunks written apart (here by local tasks standing in for the
serializer pool), sent in order, a bounded number under way, the rest cancelled on leaving."""

import asyncio
import gzip

import orjson
import pytest
from ray.serve.exceptions import BackPressureError

from serve_app.fullvocab.compression import deflate_part
from serve_app.fullvocab.json_rows import EntryFragments, chunk_json
from serve_app.fullvocab.relay import full_vocab_body, in_order, started
from serve_app.fullvocab.streamed import RowsPiece
from tests.unit.fakes import async_parts
from tests.unit.test_json_rows import TOKENS, rows_of, vllm_order


def relayed(parts, fragments: EntryFragments, gzip: bool, window: int = 3) -> bytes:
    """The body as the ingress sends it, each chunk written in a task of its own; `parts` as
    the relay takes them, or listed (arrays as lists)."""
    source = async_parts(parts) if isinstance(parts, list) else parts

    async def write(piece: RowsPiece):
        rows = piece.rows.positions(piece.start, piece.stop)
        await asyncio.sleep(0.001 * (len(rows.logprobs) % 3))  # finish out of order
        text = chunk_json(rows, fragments)
        return deflate_part(text) if gzip else text.tobytes()

    def start(rows) -> asyncio.Task:
        return asyncio.ensure_future(write(rows))

    async def body() -> bytes:
        return b"".join([piece async for piece in full_vocab_body(source, start, window, gzip)])
    return asyncio.run(body())


def test_gzip_and_plain_bodies_are_the_same_json():
    rows = rows_of(3, 7)
    parts = [b'{"a":[null', [RowsPiece(rows, i, min(i + 2, 7)) for i in range(0, 7, 2)], b"]}"]
    fragments = EntryFragments(TOKENS)
    plain = relayed(parts, fragments, gzip=False)
    assert gzip.decompress(relayed(parts, fragments, gzip=True)) == plain
    parsed = orjson.loads(plain)["a"]
    assert parsed[0] is None and len(parsed) == 8
    assert list(parsed[7]) == vllm_order(rows.ranked().token_ids[6].tolist(), 0)  # rows_of's prompt: 0s


class Call:
    """A call that finishes when told, remembering whether it was cancelled."""

    def __init__(self, log: list, index: int):
        self.future = asyncio.get_running_loop().create_future()
        self.index, self.cancelled = index, False
        log.append(self)

    def __await__(self):
        return self.future.__await__()

    def cancel(self):
        self.cancelled = True
        self.future.cancel()


async def calls(log: list, count: int):
    """`count` calls, each made when taken."""
    for index in range(count):
        yield Call(log, index)


def test_results_come_in_order_with_at_most_window_under_way():
    async def scenario():
        started: list[Call] = []
        results = in_order(calls(started, 10), window=3)
        first = asyncio.ensure_future(anext(results))
        await asyncio.sleep(0)
        assert len(started) == 3  # no more until the first is taken
        started[1].future.set_result(1)
        started[2].future.set_result(2)
        await asyncio.sleep(0)
        assert not first.done()  # the first comes first
        started[0].future.set_result(0)
        assert await first == 0 and len(started) == 3
        assert await anext(results) == 1 and len(started) == 4
        await results.aclose()  # the client left
        assert [c.cancelled for c in started] == [False, False, True, True]
    asyncio.run(scenario())


def test_a_failed_call_ends_the_relay_and_cancels_the_others():
    async def scenario():
        started: list[Call] = []
        results = in_order(calls(started, 5), window=2)
        taken = asyncio.ensure_future(anext(results))
        await asyncio.sleep(0)
        started[0].future.set_exception(RuntimeError("the pool worker died"))
        with pytest.raises(RuntimeError):
            await taken
        assert started[1].cancelled
    asyncio.run(scenario())


class ServeCall(Call):
    """A Serve handle call: cancelling one that failed raises its failure again."""

    def cancel(self):
        super().cancel()
        if self.future.done() and not self.future.cancelled() and self.future.exception():
            raise self.future.exception()


async def chunks(count: int):
    for index in range(count):
        yield index


def test_a_call_whose_cancel_raises_its_failure_fails_the_relay_with_it_and_cancels_the_rest():
    async def scenario():
        log: list[Call] = []
        results = in_order(started(chunks(5), lambda index: ServeCall(log, index)), window=3)
        taken = asyncio.ensure_future(anext(results))
        await asyncio.sleep(0)
        log[0].future.set_exception(BackPressureError(num_queued_requests=2, max_queued_requests=2))
        with pytest.raises(BackPressureError):
            await taken
        assert [c.cancelled for c in log] == [True, True, True]
    asyncio.run(scenario())
