"""A prompt as admission leaves it: its token ids and text, and how the two align."""

from dataclasses import dataclass

from serve_app.text.pieces import Pieces


@dataclass(frozen=True)
class PromptInput:
    token_ids: list[int]
    text: str
    # A string prompt: each token's (start, end) in `text`; None for token ids.
    spans: list[tuple[int, int]] | None = None
    # Token ids: each token's piece of `text`, made while decoding it.
    pieces: Pieces | None = None
