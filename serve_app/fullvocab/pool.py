"""SerializerPool: CPU workers that write full-vocabulary rows as JSON, a chunk at a time.

A Ray Serve deployment of its own, autoscaled apart from the models: the ingress hands it
pieces of chunks of a few positions (references into Ray's object store, put there by the
model replica), several at once for one response, and relays what comes back in order.
"""

import asyncio
from contextlib import asynccontextmanager

import numpy as np
from ray import serve

from serve_app.config import AppConfig
from serve_app.fullvocab import npy
from serve_app.fullvocab.compression import deflate_part
from serve_app.fullvocab.json_rows import EntryFragments, chunk_json, position_json
from serve_app.fullvocab.niceness import lower_priority
from serve_app.fullvocab.npy import NpyChunk
from serve_app.fullvocab.streamed import RowsPiece
from serve_app.observe.metrics import PoolMetrics
from serve_app.text.vocabulary import Vocabulary


@serve.deployment
class SerializerPool:
    def __init__(self, config: AppConfig):
        lower_priority(config.serializer_pool.niceness)
        self.metrics = PoolMetrics()
        # One call writes at a time (a core's worth of work); the others wait here, not in
        # the caller's router, which retries a full pool after 25 ms, doubling to 0.5 s, and
        # so left workers idle between small pieces (serializer_pool.max_ongoing_requests).
        self.turn = asyncio.Lock()
        self.fragments = {model.name: EntryFragments(Vocabulary.load(model.resolved_path()).strings)
                          for model in config.models}
        # The JSON writer is compiled (numba) on first use, or loaded from PROBSERVE_HOME's
        # cache: pay it before serving.
        fragments = next(iter(self.fragments.values()))
        position_json(np.zeros(fragments.vocab_size, np.float32), 0, fragments)

    async def write(self, model: str, piece: RowsPiece, gzip: bool):
        """The JSON of one piece's positions (`,{...},{...}`), deflated when `gzip`."""
        async with self.holding():
            rows = (await piece.rows).positions(piece.start, piece.stop)
            payload, written, sent = await asyncio.to_thread(self.encode, self.fragments[model], rows, gzip)
            encoding = "gzip" if gzip else "identity"
            self.metrics.wrote(model, "json", len(rows.logprobs), written, sent, encoding)
            return payload

    @staticmethod
    def encode(fragments: EntryFragments, rows, gzip: bool):
        """(what is sent, bytes written, bytes sent), in one trip to the worker's thread."""
        text = chunk_json(rows, fragments)
        if not gzip:
            return text.tobytes(), len(text), len(text)
        part = deflate_part(text)
        return part, len(text), len(part.data)

    async def write_npy(self, model: str, chunk: NpyChunk) -> bytes:
        """The chunk's `.npy` records (serve_app.fullvocab.npy)."""
        async with self.holding():
            rows = await chunk.rows
            records = await asyncio.to_thread(npy.chunk_records, chunk, rows)
            self.metrics.wrote(model, "npy", len(rows.logprobs), len(records), len(records), "identity")
            return records

    @asynccontextmanager
    async def holding(self):
        """Counts the call among those this worker holds (its queue depth) while it does, and
        waits for its turn to write."""
        self.metrics.in_progress.change(1)
        try:
            async with self.turn:
                yield
        finally:
            self.metrics.in_progress.change(-1)
