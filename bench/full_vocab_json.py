"""Full-vocabulary JSON on one core: the vectorized writer against the per-entry path, and
what a serializer-pool worker does (write, then deflate) against deflate alone, same process.

The per-entry baseline is what an OpenAI server does with vLLM's objects: one dict per entry,
then orjson. Both write the same `prompt_logprobs` array; the writer sorts each chunk itself (the
engine returns rows in token-id order), the per-entry path starts from sorted rows. Deflate
alone (ISA-L level 1, the pool's, and zlib level 1 beside it) on the same JSON bytes is the
limit a worker's rate is measured against.

    .venv/bin/python bench/full_vocab_json.py [--positions 64] [--vocab 49152] [--repeats 5]
"""

import argparse
import statistics
import time
import zlib

import numpy as np
import orjson

from serve_app.engine.wire import FullVocabRows, RankedRows
from serve_app.fullvocab.compression import deflate_part
from serve_app.fullvocab.json_rows import EntryFragments, chunk_json

CHUNK_POSITIONS = 16  # the pool's default


def engine_rows(positions: int, vocab: int) -> FullVocabRows:
    """Rows in token-id order, as probserve's engine returns them."""
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (positions, vocab)).astype(np.float32)
    logprobs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    prompt = rng.integers(0, vocab, positions).astype(np.int32)
    actual = logprobs[np.arange(positions), prompt]
    ranks = (logprobs > actual[:, None]).sum(axis=1) + 1
    return FullVocabRows(logprobs, prompt, actual, ranks)


def per_entry(ranked: RankedRows, tokens: list[str]) -> bytes:
    """From rows already sorted, as vLLM's engine hands them to its server."""
    positions = [None]
    for token_ids, logprobs in zip(ranked.token_ids.tolist(), ranked.logprobs.tolist()):
        positions.append({str(t): {"logprob": lp, "rank": r, "decoded_token": tokens[t]}
                          for r, (t, lp) in enumerate(zip(token_ids, logprobs), start=1)})
    return orjson.dumps(positions)


def chunks(rows: FullVocabRows) -> list[FullVocabRows]:
    return [rows.positions(start, start + CHUNK_POSITIONS)
            for start in range(0, len(rows.logprobs), CHUNK_POSITIONS)]


def vectorized(rows: FullVocabRows, fragments: EntryFragments) -> int:
    return sum(len(chunk_json(chunk, fragments)) for chunk in chunks(rows))


def pool_worker(rows: FullVocabRows, fragments: EntryFragments) -> int:
    """What a worker does for a gzip body: each chunk's JSON, deflated."""
    return sum(len(deflate_part(chunk_json(chunk, fragments)).data) for chunk in chunks(rows))


def median_seconds(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args()
    rows = engine_rows(options.positions, options.vocab)
    ranked = rows.ranked()
    tokens = [f"tok{i}" for i in range(options.vocab)]
    fragments = EntryFragments(tokens)
    texts = [chunk_json(chunk, fragments) for chunk in chunks(rows)]
    mb = sum(map(len, texts)) / 1e6
    runs = {
        "per-entry dicts + orjson": lambda: per_entry(ranked, tokens),
        "vectorized writer": lambda: vectorized(rows, fragments),
        "ISA-L deflate alone, level 1": lambda: [deflate_part(text) for text in texts],
        "zlib deflate alone, level 1": lambda: [zlib.compress(text, 1) for text in texts],
        "pool worker: writer + ISA-L deflate": lambda: pool_worker(rows, fragments),
    }
    print(f"{options.positions} positions x {options.vocab} entries, {mb:.0f} MB of JSON, "
          f"chunks of {CHUNK_POSITIONS}, one core, median of {options.repeats}\n"
          "| work | median | rate |\n| --- | --- | --- |")
    seconds = {name: median_seconds(run, options.repeats) for name, run in runs.items()}
    for name, spent in seconds.items():
        print(f"| {name} | {spent:.2f} s | {mb / spent:.0f} MB/s |")
    deflate = seconds["ISA-L deflate alone, level 1"]
    print(f"writer vs per-entry: {seconds['per-entry dicts + orjson'] / seconds['vectorized writer']:.1f}x; "
          f"pool worker vs deflate alone: {deflate / seconds['pool worker: writer + ISA-L deflate']:.2f}")


if __name__ == "__main__":
    main()
