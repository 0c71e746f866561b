"""Dataset scoring against its two baselines, in one run on the embedded SmolLM2 (float32):
documents of a fixed length scored with echo and `logprobs: 1`,

- by `probserve score` (Ray Data scorers through Serve's handle, serve_app.batch.scoring),
- by the online API at a fixed concurrency (bench/load.py's closed loop), on the same service,
- by vLLM's offline `LLM.generate` with `prompt_logprobs=1`, in a process of its own, with
  the engine settings probserve's replica uses;

in prompt tokens per second, with the ratios; then the largest difference between the
dataset's numbers and the online API's on a sample of its documents. The online API scores
documents of its own (the same length, other tokens): the dataset's would be read from the
prefix caches it filled.

    .venv/bin/python bench/dataset_scoring.py                            # 2,000 x 500 tokens
    .venv/bin/python bench/dataset_scoring.py --documents 200 --tokens 500
"""

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import orjson
import pyarrow.parquet as pq
from cpu import cpu_per_request, cpu_seconds, spent_line
from load import closed_loop, probserve_serving
from servers import AS_SHIPPED, TUNED

from serve_app.batch.dataset import ScoreOptions
from serve_app.batch.scoring import score_dataset
from serve_app.store.home import apply_cache_environment
from serve_app.store.model_store import SMOLLM2, embedded_model_path, prepare

CHECKED = 20  # documents whose numbers are compared with the online API's
ECHO = {"echo": True, "logprobs": 1, "max_tokens": 1}  # what a document's request asks
OFFLINE_DRIVER = "LLM.generate's process"
SCORE_DRIVER = "this process (Ray Data's driver)"
PER_TOKENS = "CPU ms per 1,000 prompt tokens"


def documents(count: int, tokens: int, seed: int) -> list[list[int]]:
    """Token ids of ordinary vocabulary entries, each document its own sequence."""
    chosen = random.Random(seed)
    return [chosen.sample(range(1000, 40000), tokens) for _ in range(count)]


def offline_vllm(path: Path, kv_cache_gib: int) -> tuple[float, dict[str, float]]:
    """Prompt tokens per second of vLLM's `LLM.generate` on the documents in `path`, run
    in a process of its own (vLLM's engine would share this one's Ray and cores), and its
    processes' CPU milliseconds per 1,000 of them."""
    code = f"""
import json, sys, time
sys.path.insert(0, {str(Path(__file__).parent)!r})
from cpu import cpu_per_request, cpu_seconds
from vllm import LLM, SamplingParams, TokensPrompt
docs = json.load(open({str(path)!r}))
llm = LLM(model={str(embedded_model_path(SMOLLM2))!r}, dtype="float32", max_model_len=2048,
          enforce_eager=True, max_logprobs=-1, enable_prefix_caching=False)
params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=1)
llm.generate([TokensPrompt(prompt_token_ids=docs[0])], params, use_tqdm=False)  # warm-up
started, before = time.perf_counter(), cpu_seconds("{OFFLINE_DRIVER}")
outputs = llm.generate([TokensPrompt(prompt_token_ids=d) for d in docs[1:]], params, use_tqdm=False)
seconds, tokens = time.perf_counter() - started, sum(len(d) for d in docs[1:])
spent = cpu_per_request(before, cpu_seconds("{OFFLINE_DRIVER}"), tokens / 1000)
assert all(len(o.prompt_logprobs) == len(d) for o, d in zip(outputs, docs[1:]))
print("RESULT", json.dumps([tokens / seconds, spent]))
"""
    env = {**os.environ, **AS_SHIPPED, **TUNED, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    result = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return tuple(json.loads(result.removeprefix("RESULT ")))


def online(url: str, docs: list[list[int]], concurrency: int) -> tuple[float, dict[str, float]]:
    """Prompt tokens per second of the online API, `concurrency` clients over the documents,
    and the service's CPU milliseconds per 1,000 of them."""
    queue = iter(docs)

    def next_request() -> dict:
        return {"prompt": next(queue), **ECHO}

    before = cpu_seconds()  # this process only sends the load: left out
    run = asyncio.run(closed_loop(url, SMOLLM2, next_request, concurrency, len(docs), 3600))
    assert run.statuses == {200: len(docs)}, (run.statuses, run.errors)
    tokens = sum(map(len, docs))
    return tokens / run.seconds, cpu_per_request(before, cpu_seconds(), tokens / 1000)


def dataset(url: str, docs: list[list[int]], folder: Path) -> tuple[float, dict[str, float], float]:
    """Prompt tokens per second of `probserve score`, its processes' CPU milliseconds per
    1,000 of them, and its largest difference from the online API's logprobs on the first
    documents."""
    source = folder / "documents.jsonl"
    source.write_bytes(b"".join(orjson.dumps({"tokens": d}) + b"\n" for d in docs))
    started, before = time.perf_counter(), cpu_seconds(SCORE_DRIVER)
    # A tenant of its own: the online answers compared below must not be read from the prefix
    # caches the scoring filled.
    options = ScoreOptions(model=SMOLLM2, column="tokens", tenant="bench-dataset")
    run = score_dataset(str(source), str(folder / "scored"), options)
    seconds, tokens = time.perf_counter() - started, sum(map(len, docs))
    spent = cpu_per_request(before, cpu_seconds(SCORE_DRIVER), tokens / 1000)
    assert run.refused == 0 and run.documents == len(docs)
    table = pq.read_table(folder / "scored", columns=["row", "token_logprobs"]).sort_by("row")
    difference = 0.0
    for row, doc in zip(table.slice(0, CHECKED).to_pylist(), docs):
        body = {"model": SMOLLM2, "prompt": doc, "temperature": 0, **ECHO}
        answer = httpx.post(f"{url}/v1/completions", json=body, timeout=300).json()
        expected = answer["choices"][0]["logprobs"]["token_logprobs"][1:len(doc)]
        difference = max(difference, float(np.abs(np.array(row["token_logprobs"][1:]) - expected).max()))
    return tokens / seconds, spent, difference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=500, help="a document's length")
    parser.add_argument("--concurrency", type=int, default=64, help="the online API's clients")
    parser.add_argument("--config", type=Path, default=Path("deployments/local.yaml"))
    options = parser.parse_args()
    apply_cache_environment()
    prepare(SMOLLM2)
    scored = documents(options.documents, options.tokens, seed=0)
    sent = documents(options.documents, options.tokens, seed=1)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "documents.json"
        path.write_text(json.dumps(scored))
        vllm, spent = offline_vllm(path, kv_cache_gib=1)
        print(f"vLLM LLM.generate, prompt_logprobs=1: {vllm:.0f} tokens/s", flush=True)
        print(spent_line(PER_TOKENS, spent), flush=True)
        with probserve_serving(options.config) as url:
            api, spent = online(url, sent, options.concurrency)
            print(f"online API, {options.concurrency} clients: {api:.0f} tokens/s", flush=True)
            print(spent_line(PER_TOKENS, spent), flush=True)
            ours, spent, difference = dataset(url, scored, Path(folder))
    print(f"probserve score: {ours:.0f} tokens/s; largest difference from the online API over "
          f"{CHECKED} documents: {difference:.2e}")
    print(spent_line(PER_TOKENS, spent), flush=True)
    print(f"\n| {options.documents} x {options.tokens} tokens | tokens/s | probserve score / it |\n"
          f"| --- | --- | --- |\n| probserve score | {ours:.0f} | 1.00 |\n"
          f"| online API, {options.concurrency} clients | {api:.0f} | {ours / api:.2f} |\n"
          f"| vLLM LLM.generate | {vllm:.0f} | {ours / vllm:.2f} |")


if __name__ == "__main__":
    main()
