"""Scoring over shared contexts, as an evaluation suite sends it: probserve and vLLM's own
OpenAI server, one after the other, in one run.

Scenarios (text of this script's own making, sent as token ids with `max_tokens: 1`, 8 in
flight, the requests of one context sent together):

- mmlu: each question a context of about 650 tokens and four choices of one to three words;
- continuations: one context of 1,000 tokens and 16 continuations of 8 to 24 tokens; its
  ideal is one prefill of the context plus 16 short ones, measured on probserve too.

Two request forms:

- harness: what lm-evaluation-harness' `local-completions` sends (`echo: true`, `logprobs: 1`);
  it reads the choice's token logprobs from the echoed prompt;
- span: the same with `logprob_start_len` at the choice, in place of `echo`: probserve reads
  the context from its prefix cache (vLLM's server ignores the field, so it runs the harness
  form only).

Reports wall time, requests/s and the ratio to vLLM's server, and checks that both forms give
probserve's choices the same log-probabilities as vLLM's (within 1e-3), with each process's
CPU per request; then, on probserve
idle, each form's requests one at a time on contexts no run sent: what a question's first
choice and each later one take.

    .venv/bin/python bench/shared_context.py
    .venv/bin/python bench/shared_context.py --scenario continuations
    .venv/bin/python bench/shared_context.py --questions 8 --targets probserve
"""

import argparse
import asyncio
import random
import statistics
import time
from pathlib import Path

import httpx
import numpy as np
from cpu import cpu_per_request, cpu_seconds
from servers import vllm_server
from transformers import AutoTokenizer

from serve_app.ops import cli, local_ray
from serve_app.store.home import apply_cache_environment
from serve_app.store.model_store import SMOLLM2, embedded_model_path, prepare

PORT = 8313
CONCURRENCY = 8
ALONE = 4  # questions per form sent one request at a time
SCENARIOS = {"mmlu": (650, 4, (1, 3)), "continuations": (1000, 16, (4, 12))}  # tokens, choices, words
WORDS = ("river mountain lantern harvest engine orbit violet copper meadow signal archive "
         "compass theory glacier market ribbon thunder canvas puzzle harbor falcon velvet "
         "quartz summit garden number letter window morning silver forest planet").split()


def questions(tokenizer, scenario: str, count: int, seed: int = 0) -> list[tuple[list[int], list[list[int]]]]:
    """`count` contexts of the scenario's length, each with its choices (other seeds, others)."""
    tokens, choices, (fewest, most) = SCENARIOS[scenario]
    rng = random.Random(seed)

    def words(count: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(count))

    made = []
    for index in range(count):
        context = tokenizer.encode(f"Question {index}. {words(4 * tokens)}")[:tokens - 8]
        context += tokenizer.encode("\nAnswer:")
        made.append((context, [tokenizer.encode(" " + words(rng.randint(fewest, most)))
                               for _ in range(choices)]))
    return made


def body(form: str, context: list[int], choice: list[int], model: str = SMOLLM2) -> dict:
    fields = {"echo": True} if form == "harness" else {"logprob_start_len": len(context)}
    return {"model": model, "prompt": context + choice, "max_tokens": 1, "logprobs": 1,
            "temperature": 0, **fields}


def choice_logprobs(form: str, answer: dict, context: list[int], choice: list[int]) -> list[float]:
    logprobs = answer["choices"][0]["logprobs"]["token_logprobs"]
    first = len(context) if form == "harness" else 0
    return logprobs[first:first + len(choice)]


async def run(url: str, form: str, work: list, model: str = SMOLLM2) -> tuple[float, list[list[float]]]:
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
                response = await client.post("/v1/completions", json=body(form, context, choice, model))
                response.raise_for_status()
                results[index] = choice_logprobs(form, response.json(), context, choice)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        return time.perf_counter() - started, results


def measure(url: str, runs: list[tuple[str, str]], warm_up: list, work: dict[str, list]) -> dict:
    """Each (form, contexts) run: its wall time and logprobs. Each form has contexts of its
    own, so that no run finds another's in a cache."""
    asyncio.run(run(url, "harness", warm_up))
    found = {}
    for form, contexts in runs:
        before = cpu_seconds()
        seconds, logprobs = asyncio.run(run(url, form, work[contexts]))
        spent = cpu_per_request(before, cpu_seconds(), len(logprobs))
        found[form, contexts] = (seconds, logprobs)
        print(f"  {form:>8} on the {contexts} contexts: {len(logprobs)} requests in {seconds:.1f} s "
              f"({len(logprobs) / seconds:.2f} req/s)", flush=True)
        print("    CPU ms per request: " + ", ".join(f"{role} {ms:.1f}" for role, ms in spent.items()
                                                     if ms >= 0.5), flush=True)
    return found


def ideal(url: str, unseen: tuple, work: list) -> float:
    """One prefill of each context (timed on a context of the same length no request sent
    before) and each choice alone: the time a computation of each shared prefix once takes."""
    context, _ = unseen
    once = asyncio.run(run(url, "harness", [(context[:-1], [context[-1:]])]))[0]
    choices = [(choice[:1], [choice[1:] or choice]) for _, choice_list in work for choice in choice_list]
    return len(work) * once + asyncio.run(run(url, "harness", choices))[0]


def one_at_a_time(url: str, form: str, work: list) -> tuple[float, float]:
    """Median seconds of a question's first choice and of its later ones, each sent alone."""
    first, later = [], []
    with httpx.Client(base_url=url, timeout=600) as client:
        for context, choices in work:
            for index, choice in enumerate(choices):
                started = time.perf_counter()
                client.post("/v1/completions", json=body(form, context, choice)).raise_for_status()
                (later if index else first).append(time.perf_counter() - started)
    return statistics.median(first), statistics.median(later)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="mmlu")
    parser.add_argument("--questions", type=int, help="contexts (default: 24 for mmlu, 1 for continuations)")
    parser.add_argument("--targets", nargs="+", default=["vllm", "probserve"], choices=["vllm", "probserve"])
    parser.add_argument("--config", type=Path, default=Path("deployments/local.yaml"))
    options = parser.parse_args()
    apply_cache_environment()
    prepare(SMOLLM2)
    count = options.questions or (24 if options.scenario == "mmlu" else 1)
    made = questions(AutoTokenizer.from_pretrained(embedded_model_path(SMOLLM2)), options.scenario,
                     2 * count + 2 + 2 * ALONE)
    warm_up, unseen, alone = made[:1], made[1], made[-2 * ALONE:]
    work = {"harness": made[2:2 + count], "span": made[2 + count:2 + 2 * count]}
    results = {}
    if "vllm" in options.targets:
        print("vLLM's OpenAI server (probserve's engine settings):", flush=True)
        server = vllm_server(PORT, kv_cache_gib=1)
        try:
            local_ray.wait_healthy(f"http://127.0.0.1:{PORT}")
            runs = [("harness", "harness"), ("harness", "span")]  # the span contexts: their numbers
            results["vllm"] = measure(f"http://127.0.0.1:{PORT}", runs, warm_up, work)
        finally:
            server.terminate()
            server.wait()
    if "probserve" in options.targets:
        print(f"probserve ({options.config}):", flush=True)
        args, _, _ = cli.serve_config(options.config)
        url = local_ray.start(args, port=PORT, log_to_driver=False)
        try:
            results["probserve"] = measure(url, [("harness", "harness"), ("span", "span")], warm_up, work)
            results["ideal"] = ideal(url, unseen, work["harness"])
            print(f"  one prefill of each context, and each choice alone: {results['ideal']:.1f} s",
                  flush=True)
            for form, contexts in (("harness", alone[:ALONE]), ("span", alone[ALONE:])):
                first, later = one_at_a_time(url, form, contexts)
                print(f"  {form:>8}, one request at a time: a question's first choice {first * 1000:.0f} ms, "
                      f"each later one {later * 1000:.0f} ms", flush=True)
        finally:
            local_ray.stop()
    report(results)


def report(results: dict) -> None:
    if "vllm" not in results or "probserve" not in results:
        return
    baseline_s, _ = results["vllm"]["harness", "harness"]
    print("\n| target, form | wall time | vs vLLM's server | largest logprob difference from vLLM's |")
    print("| --- | --- | --- | --- |")
    print(f"| vLLM's server, harness | {baseline_s:.1f} s | 1.00x | |")
    for (form, contexts), (seconds, logprobs) in results["probserve"].items():
        _, theirs = results["vllm"]["harness", contexts]
        difference = max(float(np.max(np.abs(np.subtract(ours, vllms))))
                         for ours, vllms in zip(logprobs, theirs, strict=True))
        print(f"| probserve, {form} | {seconds:.1f} s | {baseline_s / seconds:.2f}x | {difference:.1e} |")
    print(f"| ideal: one prefill of each context, and each choice alone (on probserve) | "
          f"{results['ideal']:.1f} s | {baseline_s / results['ideal']:.2f}x | |")


if __name__ == "__main__":
    main()
