"""Test data for shaping tests: a character tokenizer, log-probability entries; async tests."""

import asyncio
import dataclasses
import functools
from dataclasses import fields

import numpy as np

from serve_app.engine.wire import EngineResult, FullVocabParts, FullVocabRows, PositionLogprobs, RankedRows
from serve_app.fullvocab.streamed import StreamedRows
from serve_app.text.vocabulary import Vocabulary


def in_a_loop(test):
    """The test, an async function, run in an event loop of its own."""
    @functools.wraps(test)
    def run(*args, **fixtures):
        asyncio.run(test(*args, **fixtures))
    return run


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
    return FullVocabRows(distributions.astype(np.float32), actual.astype(np.int32),
                         actual_logprobs.astype(np.float32), ranks.astype(np.int64))


def full_vocab_parts(distributions: np.ndarray, prompt_token_ids: list[int], k: int,
                     chunk_positions: int = 2) -> FullVocabParts:
    """What a replica returns for prompt_logprobs -1, its chunks kept as they are."""
    return FullVocabParts.split(full_vocab_rows(distributions, prompt_token_ids), k,
                                chunk_positions)


def in_windows(result: EngineResult, sizes: list[int]) -> list[EngineResult]:
    """A full-vocabulary result as a replica sends it in windows of `sizes` chunks each: the
    last window carries the completions, the earlier ones none."""
    parts, windows, start = result.full_vocab, [], 0
    for index, size in enumerate(sizes):
        last = index == len(sizes) - 1
        rows = slice(sum(parts.sizes[:start]), sum(parts.sizes[:start + size]))
        top_k = RankedRows(*(getattr(parts.top_k, f.name)[rows] for f in fields(RankedRows)))
        window = FullVocabParts(parts.chunks[start:start + size], parts.sizes[start:start + size], top_k)
        completions = result.completions if last else []
        windows.append(dataclasses.replace(result, full_vocab=window, completions=completions))
        start += size
    return windows


def streamed(windows: list[EngineResult]) -> StreamedRows:
    """A prompt's rows as the ingress gets them from a replica, window by window."""
    async def source():
        for window in windows:
            await asyncio.sleep(0)
            yield window
    return StreamedRows(source())


async def each(items):
    """An async iterable of `items`, one at a time."""
    for item in items:
        await asyncio.sleep(0)
        yield item


async def async_parts(parts: list):
    """Body parts as the relay takes them: text as it is, arrays as async iterables."""
    for part in parts:
        yield part if isinstance(part, bytes) else each(part)
