"""Multiple choice over shared contexts, as an evaluation suite sends it: probserve and vLLM's
own OpenAI server, one after the other, in one run.

MMLU-shaped: each question is a context of about 650 tokens (text of this script's own making)
followed by four choices of one to three words; every choice is one request of token ids with
`max_tokens: 1`, 8 in flight, the four choices of a question sent together. Two request forms:

- harness: what lm-evaluation-harness' `local-completions` sends (`echo: true`, `logprobs: 1`);
  it reads the choice's token logprobs from the echoed prompt;
- span: the same with `logprob_start_len` at the choice, in place of `echo`: probserve reads
  the context from its prefix cache (vLLM's server ignores the field, so it runs the harness
  form only).

Reports wall time, requests/s and the ratio to vLLM's server, and checks that both forms give
probserve's choices the same log-probabilities as vLLM's (within 1e-3).

    .venv/bin/python bench/shared_context.py
    .venv/bin/python bench/shared_context.py --questions 8 --targets probserve
"""

import argparse
import asyncio
import random
import time
from pathlib import Path

import httpx
import numpy as np
from servers import vllm_server
from transformers import AutoTokenizer

from probserve.ops import cli, local_ray
from probserve.store.home import apply_cache_environment
from probserve.store.model_store import SMOLLM2, embedded_model_path, prepare

PORT = 8313
CONCURRENCY = 8
CONTEXT_TOKENS = 650
WORDS = ("river mountain lantern harvest engine orbit violet copper meadow signal archive "
         "compass theory glacier market ribbon thunder canvas puzzle harbor falcon velvet "
         "quartz summit garden number letter window morning silver forest planet").split()


def questions(tokenizer, count: int) -> list[tuple[list[int], list[list[int]]]]:
    """`count` contexts of CONTEXT_TOKENS tokens, each with four choices of 1-3 words."""
    rng = random.Random(0)
    made = []
    for index in range(count):
        text = f"Question {index}. " + " ".join(rng.choice(WORDS) for _ in range(4 * CONTEXT_TOKENS))
        context = tokenizer.encode(text)[:CONTEXT_TOKENS - 8] + tokenizer.encode("\nAnswer:")
        choices = [tokenizer.encode(" " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3))))
                   for _ in range(4)]
        made.append((context, choices))
    return made


def body(form: str, context: list[int], choice: list[int]) -> dict:
    fields = {"echo": True} if form == "harness" else {"logprob_start_len": len(context)}
    return {"model": SMOLLM2, "prompt": context + choice, "max_tokens": 1, "logprobs": 1,
            "temperature": 0, **fields}


def choice_logprobs(form: str, answer: dict, context: list[int], choice: list[int]) -> list[float]:
    logprobs = answer["choices"][0]["logprobs"]["token_logprobs"]
    first = len(context) if form == "harness" else 0
    return logprobs[first:first + len(choice)]


async def run(url: str, form: str, work: list) -> tuple[float, list[list[float]]]:
    """Every choice of every question, CONCURRENCY in flight, in question order; returns the
    wall time and each choice's logprobs."""
    requests = [(context, choice) for context, choices in work for choice in choices]
    results: list = [None] * len(requests)
    next_index = iter(range(len(requests)))
    limits = httpx.Limits(max_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        async def worker() -> None:
            for index in next_index:
                context, choice = requests[index]
                response = await client.post("/v1/completions", json=body(form, context, choice))
                response.raise_for_status()
                results[index] = choice_logprobs(form, response.json(), context, choice)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        return time.perf_counter() - started, results


def measure(url: str, forms: list[str], work: list) -> dict:
    asyncio.run(run(url, "harness", work[:1]))  # warm-up, on a question not measured
    found = {}
    for form in forms:
        seconds, logprobs = asyncio.run(run(url, form, work[1:]))
        found[form] = (seconds, logprobs)
        print(f"  {form:>8}: {len(logprobs)} requests in {seconds:.1f} s "
              f"({len(logprobs) / seconds:.2f} req/s)", flush=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=25, help="the first warms up")
    parser.add_argument("--targets", nargs="+", default=["vllm", "probserve"], choices=["vllm", "probserve"])
    parser.add_argument("--config", type=Path, default=Path("deployments/local.yaml"))
    options = parser.parse_args()
    apply_cache_environment()
    prepare(SMOLLM2)
    work = questions(AutoTokenizer.from_pretrained(embedded_model_path(SMOLLM2)), options.questions)
    results = {}
    if "vllm" in options.targets:
        print("vLLM's OpenAI server (probserve's engine settings):", flush=True)
        server = vllm_server(PORT, kv_cache_gib=1)
        try:
            local_ray.wait_healthy(f"http://127.0.0.1:{PORT}")
            results["vllm"] = measure(f"http://127.0.0.1:{PORT}", ["harness"], work)
        finally:
            server.terminate()
            server.wait()
    if "probserve" in options.targets:
        print(f"probserve ({options.config}):", flush=True)
        args, _, _ = cli.serve_config(options.config)
        url = local_ray.start(args, port=PORT, log_to_driver=False)
        try:
            results["probserve"] = measure(url, ["harness", "span"], work)
        finally:
            local_ray.stop()
    report(results)


def report(results: dict) -> None:
    if "vllm" not in results or "probserve" not in results:
        return
    baseline_s, baseline = results["vllm"]["harness"]
    print("\n| target, form | wall time | vs vLLM's server | largest logprob difference |")
    print("| --- | --- | --- | --- |")
    print(f"| vLLM's server, harness | {baseline_s:.1f} s | 1.00x | |")
    for form, (seconds, logprobs) in results["probserve"].items():
        difference = max(float(np.max(np.abs(np.subtract(ours, theirs))))
                         for ours, theirs in zip(logprobs, baseline, strict=True))
        print(f"| probserve, {form} | {seconds:.1f} s | {baseline_s / seconds:.2f}x | {difference:.1e} |")


if __name__ == "__main__":
    main()
