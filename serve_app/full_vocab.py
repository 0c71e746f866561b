"""The full-vocabulary path (`prompt_logprobs: -1`): whole distributions as arrays, written
to JSON a position at a time without a Python object per entry.

A position's JSON is `{"<id>": {"logprob": <lp>, "rank": <r>, "decoded_token": "<text>"}, ...}`
in rank order. Everything but the logprob text depends only on the token or the rank, so it is
prepared once per model as byte tables; each position is then one vectorized gather of
table slices and the logprobs' text (written by orjson).
"""

import numpy as np
import orjson

from serve_app.scoring import NEG_INF_LOGPROB, FullVocabRows

# Byte offsets fit 32 bits (a position is a few MB, the tables tens): half the memory traffic
# of 64-bit indices, and the gather is the cost.
OFFSET = np.int32


class ByteTable:
    """Many byte strings in one buffer, addressed by index."""

    def __init__(self, pieces: list[bytes]):
        self.lengths = np.fromiter(map(len, pieces), OFFSET, len(pieces))
        self.starts = (np.cumsum(self.lengths, dtype=OFFSET) - self.lengths).astype(OFFSET)
        self.buffer = np.frombuffer(b"".join(pieces), np.uint8)


class EntryFragments:
    """Per model: the JSON around each entry's logprob, by token id and by rank."""

    def __init__(self, token_strings: list[str]):
        self.vocab_size = len(token_strings)
        self.before = ByteTable([b'"%d":{"logprob":' % i for i in range(self.vocab_size)])
        self.rank = ByteTable([b',"rank":%d,"decoded_token":' % r
                               for r in range(1, self.vocab_size + 1)])
        self.after = ByteTable([orjson.dumps(s) + b"}," for s in token_strings])
        # One buffer holding all three tables, and each table's place in it.
        self.buffer = np.concatenate([self.before.buffer, self.rank.buffer, self.after.buffer])
        self.rank_base = len(self.before.buffer)
        self.after_base = self.rank_base + len(self.rank.buffer)


def logprob_texts(logprobs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The shortest text of each float32 logprob: (buffer, starts, lengths)."""
    text = orjson.dumps(np.maximum(logprobs, NEG_INF_LOGPROB), option=orjson.OPT_SERIALIZE_NUMPY)
    buffer = np.frombuffer(text, np.uint8)  # "[a,b,...]"
    commas = np.flatnonzero(buffer == ord(","))
    starts = np.concatenate([[1], commas + 1]).astype(OFFSET)
    ends = np.concatenate([commas, [len(buffer) - 1]]).astype(OFFSET)
    return buffer, starts, ends - starts


def gather(buffer: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """buffer[starts[0]:starts[0]+lengths[0]] + buffer[starts[1]:...] + ..., vectorized."""
    ends = np.cumsum(lengths, dtype=OFFSET)
    index = np.repeat(starts - (ends - lengths), lengths)
    index += np.arange(len(index), dtype=OFFSET)
    return np.take(buffer, index)


def position_json(token_ids: np.ndarray, logprobs: np.ndarray, fragments: EntryFragments) -> bytes:
    """One position's `{id: {logprob, rank, decoded_token}, ...}` in rank order."""
    texts, text_starts, text_lengths = logprob_texts(logprobs)
    count = len(token_ids)
    source = np.concatenate([fragments.buffer, texts])
    starts = np.empty((count, 4), OFFSET)
    lengths = np.empty((count, 4), OFFSET)
    starts[:, 0] = fragments.before.starts[token_ids]
    lengths[:, 0] = fragments.before.lengths[token_ids]
    starts[:, 1] = text_starts + len(fragments.buffer)
    lengths[:, 1] = text_lengths
    starts[:, 2] = fragments.rank.starts[:count] + fragments.rank_base
    lengths[:, 2] = fragments.rank.lengths[:count]
    starts[:, 3] = fragments.after.starts[token_ids] + fragments.after_base
    lengths[:, 3] = fragments.after.lengths[token_ids]
    body = gather(source, starts.ravel(), lengths.ravel())
    body[-1] = ord("}")  # the last entry's "," closes the object instead
    return b"{" + body.tobytes()


def chunk_json(rows: FullVocabRows, fragments: EntryFragments) -> bytes:
    """A chunk of positions as it sits in the `prompt_logprobs` array: `,{...},{...}`; the
    array is `[null` followed by its chunks in order, then `]`."""
    return b"".join(b"," + position_json(token_ids, logprobs, fragments)
                    for token_ids, logprobs in zip(rows.token_ids, rows.logprobs))
