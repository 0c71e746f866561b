"""A model's tokenizer, and each token's text decoded once per model.

A token's text does not depend on where it stands (but for a space some tokenizers drop at
the start of a text), so responses look candidates up in a table instead of decoding entry by
entry.
"""

from pathlib import Path

# Any text whose tokens decode back to it: the table decodes each token after this one.
ANCHOR_TEXT = "a"


class Vocabulary:
    def __init__(self, tokenizer, model_vocab_size: int):
        self.tokenizer = tokenizer
        self.backend = tokenizer.backend_tokenizer  # the `tokenizers` object: streaming decode
        # Logits the model scores (logit_bias keys must be below); its output layer may be
        # padded past the tokenizer's last id, and prompt ids may use either range (as in vLLM).
        self.logits_size = model_vocab_size
        self.size = max(model_vocab_size, len(tokenizer))
        self.special_ids = frozenset(i for i, t in tokenizer.added_tokens_decoder.items() if t.special)
        decoded = mid_text_strings(tokenizer)
        self.strings = decoded + [""] * (self.size - len(decoded))

    @classmethod
    def load(cls, model_path: Path) -> "Vocabulary":
        from transformers import AutoConfig, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_path)
        return cls(tokenizer, AutoConfig.from_pretrained(model_path).vocab_size)

    def encode(self, text: str, add_special_tokens: bool = True) -> tuple[list[int], list[tuple[int, int]]]:
        """The token ids of `text` and each token's (start, end) in it, in code points."""
        encoded = self.tokenizer(text, add_special_tokens=add_special_tokens,
                                 return_offsets_mapping=True)
        return encoded["input_ids"], encoded["offset_mapping"]

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids)

    def token(self, token_id: int) -> str:
        return self.strings[token_id]

    @property
    def chat_template(self) -> str | None:
        return self.tokenizer.chat_template


def mid_text_strings(tokenizer) -> list[str]:
    """Each token's text as it reads inside a text: SentencePiece decoders drop the space a
    text's first token starts with ("▁Paris" alone is "Paris", after a token " Paris")."""
    anchor = tokenizer.encode(ANCHOR_TEXT, add_special_tokens=False)[-1:]
    prefix = tokenizer.decode(anchor)
    count = len(tokenizer)
    after_anchor = tokenizer.batch_decode([anchor + [token_id] for token_id in range(count)])
    alone = tokenizer.batch_decode([[token_id] for token_id in range(count)])
    return [pair[len(prefix):] if pair.startswith(prefix) else text
            for pair, text in zip(after_anchor, alone)]
