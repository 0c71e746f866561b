"""Each token's piece of a response's text, and where it starts: `tokens` and `text_offset`.

The pieces partition the text: `text[offset[i]:offset[i + 1]] == tokens[i]` and they join
back into it, on every tokenizer family (byte-level BPE with or without a BOS token,
SentencePiece with byte fallback). Two rules make that hold where a token is not a whole
piece of text:
- a token that ends inside a character (a byte-fallback or byte-level token holding part of
  its UTF-8 bytes) has the empty piece, at the character's start; the token that completes
  the character has all of it;
- a special token the text does not contain (a BOS the tokenizer adds to a string prompt, an
  end-of-text token that ends generation) takes no room: its offset is the next token's, and
  `tokens` names it (`<|begin_of_text|>`) so that it is not mistaken for text.
Offsets count code points.
"""

from dataclasses import dataclass, field

from tokenizers.decoders import DecodeStream

from serve_app.text.vocabulary import Vocabulary


@dataclass
class Pieces:
    tokens: list[str] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)

    def add(self, token: str, offset: int) -> None:
        self.tokens.append(token)
        self.offsets.append(offset)


def string_pieces(text: str, spans: list[tuple[int, int]], token_ids: list[int],
                  vocab: Vocabulary) -> Pieces:
    """A string prompt's pieces, from the tokenizer's own alignment of tokens to the string.

    A piece runs from its token's start to the next token's, so characters the tokenizer
    maps to no token (text a normalizer drops) stay with the token before them."""
    starts, last = [], 0
    for index, (start, _) in enumerate(spans):
        last = 0 if index == 0 else max(last, start)
        starts.append(last)
    pieces = Pieces()
    for index, (token_id, start) in enumerate(zip(token_ids, starts)):
        end = starts[index + 1] if index + 1 < len(starts) else len(text)
        piece = text[start:end]
        pieces.add(piece or named_special(token_id, vocab), start)
    return pieces


def named_special(token_id: int, vocab: Vocabulary) -> str:
    """An empty piece, or a special token's name when the text does not contain it."""
    return vocab.token(token_id) if token_id in vocab.special_ids else ""


# tokenizers' DecodeStream fails so when a byte sequence decodes to less than its prefix did.
INVALID_PREFIX = "Invalid prefix encountered"


class TextStream:
    """The text each next token adds, by tokenizers' streaming decoder; "" until a token
    completes a character."""

    def __init__(self, vocab: Vocabulary, context: list[int] | None, skip_special_tokens: bool):
        self.vocab, self.skip_special_tokens = vocab, skip_special_tokens
        self.stream = DecodeStream(ids=context, skip_special_tokens=skip_special_tokens)

    def step(self, token_id: int) -> str:
        try:
            return self.stream.step(self.vocab.backend, token_id) or ""
        except Exception as error:
            if not str(error).startswith(INVALID_PREFIX):
                raise
            # Invalid UTF-8 from byte tokens: start afresh, as vLLM's detokenizer does
            # (vllm/v1/engine/detokenizer.py), so that the pieces stay those of its text.
            self.stream = DecodeStream(skip_special_tokens=self.skip_special_tokens)
            return self.stream.step(self.vocab.backend, token_id) or ""


def id_prompt_pieces(token_ids: list[int], vocab: Vocabulary) -> Pieces:
    """A token-id prompt's pieces; its text is their join (special tokens written out, as
    the tokenizer's decode writes them)."""
    stream, pieces, offset = TextStream(vocab, None, skip_special_tokens=False), Pieces(), 0
    for token_id in token_ids:
        piece = stream.step(token_id)
        pieces.add(piece, offset)
        offset += len(piece)
    return pieces


class GeneratedPieces:
    """Pieces of generated tokens, delta by delta, decoded as vLLM decodes the text: after
    the prompt, special tokens skipped."""

    def __init__(self, vocab: Vocabulary, prompt_token_ids: list[int], base: int = 0):
        self.vocab = vocab
        self.stream = TextStream(vocab, prompt_token_ids, skip_special_tokens=True)
        self.offset = base  # code points before the next token: the echoed prompt, earlier deltas

    def add(self, token_ids: list[int], text_end: int | None = None) -> Pieces:
        """The next tokens' pieces. `text_end`, when the text is complete, is where it ends:
        a stop string cuts the text inside the tokens that made it, and their pieces with it."""
        pieces = Pieces()
        for token_id in token_ids:
            piece = self.stream.step(token_id)
            offset = self.offset
            self.offset += len(piece)
            if text_end is not None:
                offset = min(offset, text_end)
                piece = piece[:text_end - offset]
            pieces.add(piece or named_special(token_id, self.vocab), offset)
        return pieces
