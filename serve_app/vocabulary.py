"""A model's tokenizer, and each token's text decoded once per model.

A token's text does not depend on where it stands, so responses look it up in a table
instead of decoding entry by entry.
"""

from pathlib import Path


class Vocabulary:
    def __init__(self, tokenizer, model_vocab_size: int):
        self.tokenizer = tokenizer
        # Logits the model scores (logit_bias keys must be below); its output layer may be
        # padded past the tokenizer's last id, and prompt ids may use either range (as in vLLM).
        self.logits_size = model_vocab_size
        self.size = max(model_vocab_size, len(tokenizer))
        decoded = tokenizer.batch_decode([[token_id] for token_id in range(len(tokenizer))])
        self.strings = decoded + [""] * (self.size - len(decoded))

    @classmethod
    def load(cls, model_path: Path) -> "Vocabulary":
        from transformers import AutoConfig, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_path)
        return cls(tokenizer, AutoConfig.from_pretrained(model_path).vocab_size)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids)

    def token(self, token_id: int) -> str:
        return self.strings[token_id]
