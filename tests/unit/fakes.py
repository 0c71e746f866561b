"""A vocabulary of single characters, for shaping tests without a real tokenizer."""

import numpy as np

from serve_app.scoring import PositionLogprobs


class CharVocabulary:
    """Token id i is the i-th character of `alphabet`."""

    def __init__(self, alphabet: str):
        self.strings = list(alphabet)
        self.size = self.logits_size = len(alphabet)

    def encode(self, text: str) -> list[int]:
        return [self.strings.index(c) for c in text]

    def decode(self, token_ids: list[int]) -> str:
        return "".join(self.strings[t] for t in token_ids)

    def token(self, token_id: int) -> str:
        return self.strings[token_id]


def positions(*rows) -> PositionLogprobs:
    """rows: None (unscored) or [(token_id, logprob, rank), ...], actual token first."""
    entries = [entry for row in rows for entry in (row or [])]
    offsets = np.cumsum([0] + [len(row or []) for row in rows])
    return PositionLogprobs(
        offsets=offsets.astype(np.int64),
        token_ids=np.array([e[0] for e in entries], np.int32),
        logprobs=np.array([e[1] for e in entries], np.float32),
        ranks=np.array([e[2] for e in entries], np.int64),
    )
