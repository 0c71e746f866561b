"""A full-vocabulary JSON body read as it streams, never held whole (a SmolLM2 position is
3.4 MB of JSON, a test's body up to a GB): its entries counted, each position's rank-1 entry
kept in order, and the body around its rows parsed (serve_app.fullvocab.json_rows writes
each entry as `"<id>":{"logprob":<lp>,"rank":<r>,"decoded_token":"<text>"}`)."""

import re

import orjson

ROWS_WRITTEN = "probserve_full_vocab_rows_total"  # the serializer pool's count of positions written
ENTRY = b'"decoded_token":'
RANK_ONE = b',"rank":1,"decoded_token":'  # once a position, wherever its entry stands
RANK_ONE_HEAD = re.compile(rb'"(\d+)":\{"logprob":([^,]+)$')  # the rank-1 entry's start
ROWS_START = b'"prompt_logprobs":[null'  # position 0, then the rows
ROWS_END = b"}}]"  # the last entry, its position and the array closed
KEPT = 4096  # bytes kept of what was read: the longest pattern and the body after the rows


class StreamedRows:
    def __init__(self):
        self.start = b""  # the body's first bytes, up to the rows
        self.kept = b""
        self.entries = 0
        self.rank_ones: list[tuple[int, float]] = []  # (token id, logprob) a position

    def feed(self, piece: bytes) -> None:
        if ROWS_START not in self.start:
            self.start += piece
        text, new = self.kept + piece, len(self.kept)
        # Each match counted once: in the text where it ends past what was kept.
        self.entries += text.count(ENTRY, max(0, new - len(ENTRY) + 1))
        at = text.find(RANK_ONE, max(0, new - len(RANK_ONE) + 1))
        while at != -1:
            head = RANK_ONE_HEAD.search(text, max(0, at - 64), at)
            assert head, text[max(0, at - 64):at + len(RANK_ONE)]
            self.rank_ones.append((int(head[1]), float(head[2])))
            at = text.find(RANK_ONE, at + 1)
        self.kept = text[-KEPT:]

    def envelope(self) -> dict:
        """The body of one choice with its rows left out: `prompt_logprobs` is `[null]`."""
        head = self.start[:self.start.index(ROWS_START) + len(ROWS_START)]
        return orjson.loads(head + b"]" + self.kept[self.kept.rindex(ROWS_END) + len(ROWS_END):])
