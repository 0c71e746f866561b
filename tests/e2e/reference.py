"""The reference the service is checked against: a float32 transformers forward pass."""

import json

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

TOLERANCE = 1e-4
PEFT_PREFIX = "base_model.model."


@torch.no_grad()
def merge_lora(model, folder) -> None:
    """A PEFT LoRA adapter merged into the model's weights by hand: W + (alpha / r) B A."""
    config = json.loads((folder / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    weights = load_file(folder / "adapter_model.safetensors")
    modules = dict(model.named_modules())
    downs = [key for key in weights if key.endswith(".lora_A.weight")]
    for down in downs:
        module = down.removeprefix(PEFT_PREFIX).removesuffix(".lora_A.weight")
        up = weights[down.replace(".lora_A.", ".lora_B.")]
        modules[module].weight += scale * up @ weights[down]
    assert downs, f"no LoRA weights in {folder}"


class Reference:
    def __init__(self, path, adapter=None):
        """The model at `path`, with the LoRA adapter in folder `adapter` merged if given."""
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        if adapter is not None:
            merge_lora(self.model, adapter)
        self.tokenizer = AutoTokenizer.from_pretrained(path)

    @torch.no_grad()
    def log_softmax(self, token_ids: list[int]) -> np.ndarray:
        """[len(token_ids), vocab]: row i is the distribution after token_ids[: i + 1]."""
        logits = self.model(torch.tensor([token_ids])).logits[0]
        return torch.log_softmax(logits.float(), dim=-1).numpy()

    def prompt_rows(self, token_ids: list[int]) -> np.ndarray:
        """Row p is the distribution that predicted prompt token p (row 0 is NaN)."""
        rows = self.log_softmax(token_ids)
        return np.vstack([np.full((1, rows.shape[1]), np.nan), rows[:-1]])

    def greedy(self, token_ids: list[int], count: int) -> list[int]:
        ids = list(token_ids)
        for _ in range(count):
            ids.append(int(self.log_softmax(ids)[-1].argmax()))
        return ids[len(token_ids):]


def rank_bounds(row: np.ndarray, token_id: int) -> tuple[int, int]:
    """The ranks `token_id` can have in `row`, allowing for float noise between engines."""
    value = row[token_id]
    return int((row > value + TOLERANCE).sum()) + 1, int((row >= value - TOLERANCE).sum())


def assert_rank(row: np.ndarray, token_id: int, rank: int) -> None:
    low, high = rank_bounds(row, token_id)
    assert low <= rank <= high, f"token {token_id}: rank {rank}, reference {low}..{high}"


def text_inside(tokenizer, token_id: int) -> str:
    """The token's text as it reads inside a text, as `top_logprobs` keys it: after another
    token, so that a SentencePiece decoder keeps the space it drops at a text's start."""
    (anchor,) = tokenizer.encode("a", add_special_tokens=False)[-1:]
    return tokenizer.decode([anchor, token_id])[len(tokenizer.decode([anchor])):]


def assert_top_texts(top: dict[str, float], tokenizer, row: np.ndarray, k: int,
                     token_id: int | None, text=None) -> None:
    """`top` ({text: logprob}, as `top_logprobs` keys a position) is the top k of `row` plus
    `token_id` (None: the top k alone), each value bound to its text (`text(id)`; by default
    the token decoded alone). Texts can collide (byte tokens all decode to U+FFFD): such a
    text holds the value of one of its tokens."""
    text = text or (lambda shown_id: tokenizer.decode([shown_id]))
    order = np.argsort(-row)
    if k:  # else the top k is not one set of tokens, and the prompt must change
        assert row[order[k - 1]] - row[order[k]] > TOLERANCE, f"a near tie at place {k}"
    shown = [*order[:k], *([] if token_id is None else [token_id])]
    expected: dict[str, list[float]] = {}
    for shown_id in shown:
        expected.setdefault(text(int(shown_id)), []).append(float(row[shown_id]))
    assert top.keys() == expected.keys(), (sorted(top), sorted(expected))
    for text, value in top.items():
        assert np.isclose(value, expected[text], atol=TOLERANCE).any(), (text, value, expected[text])


def assert_top_k(row: np.ndarray, token_ids: list[int], logprobs: list[float], k: int) -> None:
    """`token_ids` are a top-k of `row`, in order, with the reference's logprobs."""
    assert len(token_ids) == k
    np.testing.assert_allclose(logprobs, row[token_ids], atol=TOLERANCE)
    kth = np.sort(row)[::-1][k - 1]
    assert all(row[t] >= kth - TOLERANCE for t in token_ids)
    assert list(logprobs) == sorted(logprobs, reverse=True)
