"""Full-vocabulary JSON: the vectorized writer against the per-entry path, same process.

The per-entry baseline is what an OpenAI server does with vLLM's objects: one dict per entry,
then orjson. Both write the same `prompt_logprobs` array from the same sorted rows.

    .venv/bin/python bench/full_vocab_json.py [--positions 64] [--vocab 49152] [--repeats 5]
"""

import argparse
import statistics
import time

import numpy as np
import orjson

from serve_app.full_vocab import EntryFragments, prompt_logprobs_json
from serve_app.scoring import FullVocabRows


def sorted_rows(positions: int, vocab: int) -> FullVocabRows:
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (positions, vocab)).astype(np.float32)
    logprobs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    order = np.argsort(-logprobs, axis=1).astype(np.int32)
    first = np.zeros(positions, np.int64)  # the prompt tokens' own values: unused by writers
    return FullVocabRows(order, np.take_along_axis(logprobs, order, axis=1), first.astype(np.float32),
                         first)


def per_entry(rows: FullVocabRows, tokens: list[str]) -> bytes:
    positions = [None]
    for token_ids, logprobs in zip(rows.token_ids.tolist(), rows.logprobs.tolist()):
        positions.append({str(t): {"logprob": lp, "rank": r, "decoded_token": tokens[t]}
                          for r, (t, lp) in enumerate(zip(token_ids, logprobs), start=1)})
    return orjson.dumps(positions)


def vectorized(rows: FullVocabRows, fragments: EntryFragments) -> int:
    return sum(len(chunk) for chunk in prompt_logprobs_json(rows, fragments))


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
    rows = sorted_rows(options.positions, options.vocab)
    tokens = [f"tok{i}" for i in range(options.vocab)]
    fragments = EntryFragments(tokens)
    size = vectorized(rows, fragments)
    fast = median_seconds(lambda: vectorized(rows, fragments), options.repeats)
    slow = median_seconds(lambda: per_entry(rows, tokens), options.repeats)
    mb = size / 1e6
    print(f"{options.positions} positions x {options.vocab} entries, {mb:.0f} MB of JSON, "
          f"median of {options.repeats}")
    print(f"per-entry dicts + orjson: {slow:.2f} s ({mb / slow:.0f} MB/s)")
    print(f"vectorized writer:        {fast:.2f} s ({mb / fast:.0f} MB/s)")
    print(f"speed-up: {slow / fast:.1f}x")


if __name__ == "__main__":
    main()
