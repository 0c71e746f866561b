"""Test data for shaping tests: a character tokenizer, log-probability entries."""

import numpy as np

from probserve.engine.wire import FullVocabParts, FullVocabRows, PositionLogprobs
from probserve.text.vocabulary import Vocabulary


def char_vocabulary(alphabet: str, specials: tuple[str, ...] = (),
                    chat_template: str | None = None) -> Vocabulary:
    """A real tokenizer whose token i is the i-th character of `alphabet` (then `specials`),
    built in memory: shaping tests get exact, readable token ids."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    symbols = list(alphabet) + list(specials)
    chars = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(symbols)}, merges=[]))
    chars.decoder = decoders.Fuse()
    chars.add_special_tokens(list(specials))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=chars)
    tokenizer.chat_template = chat_template
    return Vocabulary(tokenizer, len(symbols))


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


def full_vocab_rows(distributions: np.ndarray, prompt_token_ids: list[int]) -> FullVocabRows:
    """What the engine returns for prompt_logprobs -1: row r is the distribution that predicted
    prompt token r + 1 (`distributions[r]`, in token order)."""
    actual = np.asarray(prompt_token_ids[1:], np.int64)
    actual_logprobs = distributions[np.arange(len(distributions)), actual]
    ranks = (distributions > actual_logprobs[:, None]).sum(axis=1) + 1
    return FullVocabRows(distributions.astype(np.float32), actual_logprobs.astype(np.float32),
                         ranks.astype(np.int64))


def full_vocab_parts(distributions: np.ndarray, prompt_token_ids: list[int], k: int,
                     chunk_positions: int = 2) -> FullVocabParts:
    """What a replica returns for prompt_logprobs -1, its chunks kept as they are."""
    return FullVocabParts.split(full_vocab_rows(distributions, prompt_token_ids), k,
                                chunk_positions, store=lambda rows: rows)
