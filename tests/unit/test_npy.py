"""The binary form: a streamed .npy file that NumPy reads back."""

import asyncio
import io

import numpy as np
import pytest

from serve_app.engine.wire import EngineResult
from serve_app.fullvocab import npy
from tests.unit.fakes import full_vocab_parts, in_windows, streamed


@pytest.mark.parametrize("accept, chosen", [
    ("application/x-npy", True), ("application/json, application/x-npy;q=0.5", True),
    ("application/x-npy;q=0", False), ("*/*", False), (None, False),
])
def test_npy_only_when_named(accept, chosen):
    assert npy.accepts_npy(accept) is chosen


def test_header_and_records_are_an_npy_file():
    dtype = npy.record_dtype(5)
    logprobs = np.log(np.full((2, 5), 0.2, np.float32))
    data = npy.header(dtype, 3) + npy.first_position(0, 7, 5) + npy.records(0, 1, [3, 4], logprobs)
    assert len(npy.header(dtype, 3)) % 64 == 0
    loaded = np.load(io.BytesIO(data))
    assert loaded["token_id"].tolist() == [7, 3, 4] and loaded["position"].tolist() == [0, 1, 2]
    assert np.isnan(loaded["logprobs"][0]).all()
    assert np.array_equal(loaded["logprobs"][1:], logprobs)


def test_rows_go_back_to_token_order():
    distributions = np.log(np.random.default_rng(0).dirichlet(np.ones(6), 3)).astype(np.float32)
    prompts = [[0, 1, 2, 3], [5]]
    results = [EngineResult(np.array(p, np.int32), None, [],
                            full_vocab_parts(distributions[: len(p) - 1], p, k=0, chunk_positions=2))
               for p in prompts]
    # the first prompt's rows in two windows of a chunk each; the second has none
    rows = [streamed(in_windows(results[0], [1, 1])), streamed(in_windows(results[1], [0]))]

    async def written() -> list[bytes]:
        return [npy.chunk_records(c, c.rows) if isinstance(c, npy.NpyChunk) else c
                async for part in npy.body_parts(prompts, rows, 6)
                for c in ([part] if isinstance(part, bytes) else [c async for c in part])]
    loaded = np.load(io.BytesIO(b"".join(asyncio.run(written()))))
    assert loaded["prompt"].tolist() == [0, 0, 0, 0, 1]
    assert loaded["position"].tolist() == [0, 1, 2, 3, 0]
    assert loaded["token_id"].tolist() == [0, 1, 2, 3, 5]
    assert np.array_equal(loaded["logprobs"][1:4], distributions)
