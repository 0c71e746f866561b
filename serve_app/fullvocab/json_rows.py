"""The full-vocabulary path (`prompt_logprobs: -1`): whole distributions as arrays, written
to JSON a position at a time without a Python object per entry.

A position's JSON is `{"<id>": {"logprob": <lp>, "rank": <r>, "decoded_token": "<text>"},
...}`: the prompt token's entry first, then the others in rank order, as vLLM orders it.
Everything but the logprob text depends only on the token or the rank, so it is prepared once
per model as byte tables; each row is sorted (the engine returns it in token-id order),
orjson writes its logprobs' text, and a compiled loop (numba) copies each entry's four pieces
into the output.
"""

import numba
import numpy as np
import orjson

from serve_app.engine.wire import FullVocabRows, RankedRows
from serve_app.vllm_constants import NEG_INF_LOGPROB

# Byte offsets fit 32 bits (a position is a few MB, the tables tens).
OFFSET = np.int32
COMMA, OPEN, CLOSE = b",{}"
# About what an entry takes (`"12345":{"logprob":-9.876543,"rank":123,"decoded_token":"abc"},`):
# a SmolLM2 position, 49,152 entries, is 3.4 MB.
ENTRY_BYTES = 70


def piece_positions(vocab_size: int, piece_bytes: int) -> int:
    """Positions whose JSON is about `piece_bytes` (at least one)."""
    return max(1, piece_bytes // (vocab_size * ENTRY_BYTES))


class ByteTable:
    """Many byte strings in one buffer, addressed by index."""

    def __init__(self, pieces: list[bytes]):
        self.lengths = np.fromiter(map(len, pieces), OFFSET, len(pieces))
        self.starts = (np.cumsum(self.lengths, dtype=OFFSET) - self.lengths).astype(OFFSET)
        self.buffer = np.frombuffer(b"".join(pieces), np.uint8)


class EntryFragments:
    """Per model: the JSON around each entry's logprob, by token id and by rank, in one buffer."""

    def __init__(self, token_strings: list[str]):
        self.vocab_size = len(token_strings)
        before = ByteTable([b'"%d":{"logprob":' % i for i in range(self.vocab_size)])
        rank = ByteTable([b',"rank":%d,"decoded_token":' % r for r in range(1, self.vocab_size + 1)])
        after = ByteTable([orjson.dumps(s) + b"}," for s in token_strings])
        self.buffer = np.concatenate([before.buffer, rank.buffer, after.buffer])
        # (starts in `buffer`, lengths) of each table, as the writer takes them.
        self.tables = (before.starts, before.lengths,
                       rank.starts + len(before.buffer), rank.lengths,
                       after.starts + len(before.buffer) + len(rank.buffer), after.lengths)


def logprob_texts(logprobs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The shortest text of each float32 logprob: (buffer, starts, lengths)."""
    text = orjson.dumps(np.maximum(logprobs, NEG_INF_LOGPROB), option=orjson.OPT_SERIALIZE_NUMPY)
    buffer = np.frombuffer(text, np.uint8)  # "[a,b,...]"
    commas = np.flatnonzero(buffer == ord(","))
    starts = np.concatenate([[1], commas + 1]).astype(OFFSET)
    ends = np.concatenate([commas, [len(buffer) - 1]]).astype(OFFSET)
    return buffer, starts, ends - starts


@numba.njit(inline="always")
def copy_piece(out, at, source, start, length):
    for i in range(length):
        out[at + i] = source[start + i]
    return at + length


@numba.njit(inline="always")
def write_entry(out, at, j, token_ids, texts, text_starts, text_lengths, buffer, tables):
    """Entry j of a row by rank: before[token], the logprob's text, rank[j], after[token]."""
    before_starts, before_lengths, rank_starts, rank_lengths, after_starts, after_lengths = tables
    token = token_ids[j]
    at = copy_piece(out, at, buffer, before_starts[token], before_lengths[token])
    at = copy_piece(out, at, texts, text_starts[j], text_lengths[j])
    at = copy_piece(out, at, buffer, rank_starts[j], rank_lengths[j])
    return copy_piece(out, at, buffer, after_starts[token], after_lengths[token])


@numba.njit(nogil=True, cache=True)
def write_position(out, at, first, token_ids, texts, text_starts, text_lengths, buffer, tables):
    """`,{entries}` at out[at:], entry `first` (the prompt token's) then the others by rank;
    returns the end. `tables`: EntryFragments.tables."""
    out[at] = COMMA
    out[at + 1] = OPEN
    at = write_entry(out, at + 2, first, token_ids, texts, text_starts, text_lengths, buffer, tables)
    for j in range(token_ids.shape[0]):
        if j != first:
            at = write_entry(out, at, j, token_ids, texts, text_starts, text_lengths, buffer, tables)
    out[at - 1] = CLOSE  # the last entry's "," closes the object instead
    return at


def positions_json(ranked: RankedRows, fragments: EntryFragments) -> np.ndarray:
    """`,{...},{...}` (uint8): rows of token ids by rank and their logprobs, each row's prompt
    token first."""
    texts = [logprob_texts(row) for row in ranked.logprobs]
    firsts = (ranked.token_ids == ranked.actual_token_ids[:, None]).argmax(axis=1)
    # Each row names each token and each rank at most once: the tables bound its size.
    out = np.empty(sum(2 + len(fragments.buffer) + len(text) for text, _, _ in texts), np.uint8)
    at = 0
    for row, first, (text, starts, lengths) in zip(ranked.token_ids, firsts, texts, strict=True):
        at = write_position(out, at, first, row, text, starts, lengths, fragments.buffer, fragments.tables)
    return out[:at]


def position_json(logprobs: np.ndarray, token_id: int, fragments: EntryFragments) -> bytes:
    """One position's `{...}`, from its logprobs in token-id order, for the prompt token
    `token_id`."""
    rank = int((logprobs > logprobs[token_id]).sum()) + 1
    row = FullVocabRows(logprobs[None], np.array([token_id], np.int32), logprobs[[token_id]],
                        np.array([rank], np.int64))
    return chunk_json(row, fragments)[1:].tobytes()


def chunk_json(rows: FullVocabRows, fragments: EntryFragments) -> np.ndarray:
    """A chunk of positions as it sits in the `prompt_logprobs` array: `,{...},{...}` (uint8,
    for deflate to read in place); the array is `[null` followed by its chunks in order,
    then `]`."""
    return positions_json(rows.ranked(), fragments)
