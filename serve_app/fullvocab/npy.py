"""The binary form of the full vocabulary: a NumPy `.npy` file, streamed.

Chosen with `Accept: application/x-npy` on a `prompt_logprobs: -1` request. One record per
prompt position, in order, for every prompt of the request:
`prompt` (uint32, the prompt's index), `position` (uint32), `token_id` (uint32, the prompt's
token there) and `logprobs` (float32 [vocabulary], in token-id order: the distribution that
predicted this token; NaN at position 0, which nothing predicts). Four bytes per entry against
about seventy in JSON. `.npy` rather than Arrow IPC: any NumPy reads it (`np.load`), with no
other dependency, and its header gives dtype and record count up front, so the records
stream behind it.
"""

from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np

from serve_app.engine.wire import FullVocabRows
from serve_app.fullvocab.compression import admits
from serve_app.fullvocab.streamed import StreamedRows

MEDIA_TYPE = "application/x-npy"
MAGIC = b"\x93NUMPY\x01\x00"  # format version 1.0
HEADER_ALIGNMENT = 64


def accepts_npy(accept: str | None) -> bool:
    """Only when asked by name: JSON stays the form for `*/*`."""
    return admits(accept, (MEDIA_TYPE,))


def record_dtype(vocab_size: int) -> np.dtype:
    return np.dtype([("prompt", "<u4"), ("position", "<u4"), ("token_id", "<u4"),
                     ("logprobs", "<f4", (vocab_size,))])


def header(dtype: np.dtype, records: int) -> bytes:
    """The `.npy` header of a 1-D array of `records` records of `dtype`."""
    fields = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
              "shape": (records,)}
    text = repr(fields).encode("latin1")
    padding = -(len(MAGIC) + 2 + len(text) + 1) % HEADER_ALIGNMENT
    text += b" " * padding + b"\n"
    return MAGIC + len(text).to_bytes(2, "little") + text


def records(prompt: int, first_position: int, token_ids: list[int],
            logprobs: np.ndarray) -> bytes:
    """Consecutive positions of one prompt; `logprobs` [positions, vocabulary] by token id."""
    out = np.empty(len(token_ids), record_dtype(logprobs.shape[1]))
    out["prompt"] = prompt
    out["position"] = np.arange(first_position, first_position + len(token_ids))
    out["token_id"] = token_ids
    out["logprobs"] = logprobs
    return out.tobytes()


def first_position(prompt: int, token_id: int, vocab_size: int) -> bytes:
    """Position 0: its token, and NaN where no distribution predicted it."""
    return records(prompt, 0, [token_id], np.full((1, vocab_size), np.nan, np.float32))


@dataclass(frozen=True)
class NpyChunk:
    """A chunk of rows and where its records go: the pool writes them."""

    rows: object  # the chunk as the replica stored it
    prompt: int
    first_position: int
    token_ids: list[int]  # the prompt's tokens at those positions


async def body_parts(prompts: list[list[int]], rows: list[StreamedRows],
                     vocab_size: int) -> AsyncIterator[bytes | AsyncIterator[NpyChunk]]:
    """The header, then each prompt's position 0 and its chunks as they come, as the relay
    takes them."""
    yield header(record_dtype(vocab_size), sum(map(len, prompts)))
    for index, (token_ids, streamed) in enumerate(zip(prompts, rows, strict=True)):
        yield first_position(index, token_ids[0], vocab_size)
        yield prompt_chunks(index, token_ids, streamed)


async def prompt_chunks(index: int, token_ids: list[int], rows: StreamedRows) -> AsyncIterator[NpyChunk]:
    start = 1
    async for window in rows.parts(last_use=True):
        for chunk, size in zip(window.chunks, window.sizes, strict=True):
            yield NpyChunk(chunk, index, start, token_ids[start:start + size])
            start += size


def chunk_records(chunk: NpyChunk, rows: FullVocabRows) -> bytes:
    """The chunk's records: its rows are already in token-id order."""
    return records(chunk.prompt, chunk.first_position, chunk.token_ids, rows.logprobs)
