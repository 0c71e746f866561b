"""Load: named workloads against probserve, vLLM's own OpenAI server and Ray Serve LLM's OpenAI
app, side by side in one run.

All serve the embedded SmolLM2-135M-Instruct in float32 on this machine, one after the other
(never together: they would share the cores). Each run is bounded in requests and in time,
at a fixed concurrency (closed loop) or a target rate (open loop, Poisson arrivals), and
reports answered requests a second, tokens/s (prompt tokens computed plus generated), p50/p99
latency to the last byte, status counts, and the CPU time per answered request of each of the
server's processes (Serve's proxy, each deployment's replicas, vLLM's engine core...); then a
table of every run and the ratios of probserve to each peer.

    .venv/bin/python bench/load.py                                  # the benchmark table
    .venv/bin/python bench/load.py --workloads distinct --sweep --targets vllm ray-serve-llm probserve
    .venv/bin/python bench/load.py --workloads distinct repeated --concurrency 16 64 --requests 300
    .venv/bin/python bench/load.py --workloads mixed --rate 20 --requests 400 --targets probserve
    .venv/bin/python bench/load.py --targets vllm ray-serve-llm probserve
"""

import argparse
import asyncio
import collections
import itertools
import random
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
from cpu import cpu_per_request, cpu_seconds, spent_line
from servers import ray_serve_llm, vllm_server
from shared_context import WORDS

from serve_app.ops import cli, local_ray
from serve_app.store.home import apply_cache_environment
from serve_app.store.model_store import SMOLLM2, prepare

PORT = 8312
# Each echo128 request scores a sequence of its own, as an evaluation set's items are: a
# sequence sent again would be served from serve_app's prefix caches.
ECHO_SEQUENCES = random.Random(0)
FULL_VOCAB_IDS = list(range(2000, 2032))
SWEEP = [1, 4, 16, 64, 128, 256]


class Questions:
    """Distinct prompts, as many clients send them ("Question 17: ... the capital of France
    is"), seeded: each run of a plan draws its own, the same on every server, so that no
    prefix cache or coalescing of identical work serves one request from another."""

    def __init__(self):
        self.start(0)

    def start(self, seed: int) -> None:
        self.rng, self.numbers = random.Random(seed), itertools.count()

    def next(self) -> str:
        words = " ".join(self.rng.choices(WORDS, k=6))
        return f"Question {next(self.numbers)}: {words}, the capital of France is"


QUESTIONS = Questions()


def distinct() -> dict:
    """A small request of a prompt never sent before: production traffic."""
    return {"prompt": QUESTIONS.next(), "max_tokens": 1, "logprobs": 5}


def repeated() -> dict:
    """The same small request every time: what a service that shares identical work serves
    fastest, so a workload of its own, never the measure of real traffic."""
    return {"prompt": "The capital of France is", "max_tokens": 1, "logprobs": 5}


def echo128() -> dict:
    """An evaluation harness's request: score a 128-token sequence."""
    return {"prompt": ECHO_SEQUENCES.sample(range(1000, 40000), 128), "echo": True, "logprobs": 1,
            "max_tokens": 1}


def full_vocab() -> dict:
    return {"prompt": FULL_VOCAB_IDS, "max_tokens": 1, "prompt_logprobs": -1}


def mixed() -> dict:
    """Production-like: mostly small requests, some scoring, a few full distributions."""
    return random.choices([distinct, echo128, full_vocab], weights=[90, 8, 2])[0]()


WORKLOADS = {"distinct": distinct, "repeated": repeated, "echo128": echo128, "full_vocab": full_vocab,
             "mixed": mixed}
DEFAULT_RUNS = [("distinct", 1, 100), ("distinct", 16, 200), ("distinct", 64, 400), ("echo128", 16, 100)]


def median_and_p99(values: list[float]) -> tuple[float, float]:
    """The median and the 99th percentile (nearest rank) of `values`; NaN when there are none."""
    if not values:
        return float("nan"), float("nan")
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


@dataclass
class Run:
    latencies: list[float] = field(default_factory=list)
    statuses: collections.Counter = field(default_factory=collections.Counter)
    errors: dict = field(default_factory=dict)  # status -> the first refusal's body
    tokens: int = 0
    seconds: float = 0.0
    cpu_ms: dict = field(default_factory=dict)  # role -> CPU milliseconds per answered request

    def report(self) -> dict:
        p50, p99 = median_and_p99(self.latencies)
        return {
            "requests": len(self.latencies),
            "seconds": self.seconds,
            # Answered requests: a refusal is quick, and counted it would pass for throughput.
            "req/s": self.statuses[200] / self.seconds,
            "tokens/s": self.tokens / self.seconds,
            "p50": p50,
            "p99": p99,
            "statuses": dict(self.statuses),
            "errors": self.errors,
            "cpu_ms": self.cpu_ms,
        }


def counted_tokens(body: dict, content: bytes) -> int:
    """Prompt plus generated tokens of a 200: from `usage`, or the request for full bodies."""
    if body.get("prompt_logprobs") == -1:
        return len(body["prompt"]) + body["max_tokens"]
    return orjson.loads(content)["usage"]["total_tokens"]


async def one(client: httpx.AsyncClient, model: str, make, run: Run) -> None:
    body = {"model": model, "temperature": 0, **make()}
    started = time.perf_counter()
    try:
        response = await client.post("/v1/completions", json=body, headers={"accept-encoding": "gzip"})
        content = response.content
        status = response.status_code
    except httpx.HTTPError as error:
        run.statuses[type(error).__name__] += 1
        return
    run.latencies.append(time.perf_counter() - started)
    run.statuses[status] += 1
    if status == 200:
        run.tokens += counted_tokens(body, content)
    else:
        run.errors.setdefault(status, content[:300].decode(errors="replace"))


async def closed_loop(url: str, model: str, make, concurrency: int, requests: int,
                      time_limit: float) -> Run:
    """`concurrency` clients, each sending its next request when the last one ends."""
    run, left = Run(), [requests]
    deadline = time.perf_counter() + time_limit
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=time_limit, limits=limits) as client:
        async def worker() -> None:
            while left[0] > 0 and time.perf_counter() < deadline:
                left[0] -= 1
                await one(client, model, make, run)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        run.seconds = time.perf_counter() - started
    return run


async def open_loop(url: str, model: str, make, rate: float, requests: int, time_limit: float,
                    max_in_flight: int = 512) -> Run:
    """Requests at Poisson arrivals of `rate` per second, whatever the answers' pace."""
    run, tasks = Run(), []
    deadline = time.perf_counter() + time_limit
    limits = httpx.Limits(max_connections=max_in_flight)
    async with httpx.AsyncClient(base_url=url, timeout=time_limit, limits=limits) as client:
        started = time.perf_counter()
        for _ in range(requests):
            if time.perf_counter() >= deadline:
                break
            tasks.append(asyncio.create_task(one(client, model, make, run)))
            await asyncio.sleep(random.expovariate(rate))
        await asyncio.gather(*tasks)
        run.seconds = time.perf_counter() - started
    return run


def measure(url: str, model: str, plan: list[tuple], rate: float | None, time_limit: float) -> dict:
    QUESTIONS.start(len(plan))
    asyncio.run(closed_loop(url, model, distinct, 4, 8, time_limit))  # warm-up
    results = {}
    for index, (workload, concurrency, requests) in enumerate(plan):
        random.seed(0)  # the same mix for every server
        QUESTIONS.start(index)
        make = WORKLOADS[workload]
        before = cpu_seconds()
        if rate:
            run = asyncio.run(open_loop(url, model, make, rate, requests, time_limit))
        else:
            run = asyncio.run(closed_loop(url, model, make, concurrency, requests, time_limit))
        run.cpu_ms = cpu_per_request(before, cpu_seconds(), run.statuses[200])
        results[workload, concurrency] = report = run.report()
        print(f"  {workload:>10} c{concurrency:<3} {report['requests']:>4} req  "
              f"{report['req/s']:6.2f} req/s  {report['tokens/s']:8.0f} tok/s  "
              f"p50 {report['p50']:.3f} s  p99 {report['p99']:.3f} s  {report['statuses']}", flush=True)
        print(spent_line("CPU ms per request", report["cpu_ms"]), flush=True)
        for status, body in report["errors"].items():
            print(f"    first {status}: {body}", flush=True)
    return results


def run_vllm(plan, rate, time_limit, tuned: bool) -> dict:
    print(f"vLLM's OpenAI server ({'tuned' if tuned else 'defaults'}):", flush=True)
    server = vllm_server(PORT, kv_cache_gib=1, tuned=tuned)
    try:
        local_ray.wait_healthy(f"http://127.0.0.1:{PORT}")
        return measure(f"http://127.0.0.1:{PORT}", SMOLLM2, plan, rate, time_limit)
    finally:
        server.terminate()
        server.wait()


def run_ray_serve_llm(plan, rate, time_limit) -> dict:
    print("Ray Serve LLM (build_openai_app):", flush=True)
    url = ray_serve_llm(PORT)
    try:
        return measure(url, SMOLLM2, plan, rate, time_limit)
    finally:
        local_ray.stop()


@contextmanager
def probserve_serving(config: Path, sections: dict | None = None) -> Iterator[str]:
    """probserve on `config` and the embedded SmolLM2, in this process's own Ray: its URL,
    stopped after. `sections`: settings that replace those of the file's sections (a section's
    keys; a list, such as `models`, whole)."""
    apply_cache_environment()
    prepare(SMOLLM2)
    args, _, _ = cli.serve_config(config)
    args = {**args, **{name: {**args.get(name, {}), **value} if isinstance(value, dict) else value
                       for name, value in (sections or {}).items()}}
    url = local_ray.start(args, port=PORT, log_to_driver=False)
    try:
        yield url
    finally:
        local_ray.stop()


def run_probserve(config: Path, plan, rate, time_limit) -> dict:
    print(f"probserve ({config}):", flush=True)
    with probserve_serving(config) as url:
        return measure(url, SMOLLM2, plan, rate, time_limit)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16])
    parser.add_argument("--sweep", action="store_true", help=f"clients {SWEEP}, each run at least "
                        "2 requests a client")
    parser.add_argument("--rate", type=float, help="requests per second (open loop) instead of "
                                                   "a fixed concurrency")
    parser.add_argument("--requests", type=int, default=100, help="at most, per run")
    parser.add_argument("--time-limit", type=float, default=300, help="seconds, at most, per run")
    parser.add_argument("--targets", nargs="+", default=["vllm", "probserve"],
                        choices=["vllm", "vllm-defaults", "ray-serve-llm", "probserve"],
                        help="vllm: vLLM's server with probserve's engine settings; "
                             "vllm-defaults: as a new user starts it; ray-serve-llm: Ray Serve "
                             "LLM's OpenAI app with probserve's engine settings")
    parser.add_argument("--config", type=Path, default=Path("deployments/local.yaml"))
    options = parser.parse_args()
    clients = SWEEP if options.sweep else options.concurrency
    plan = DEFAULT_RUNS if not options.workloads else [
        (w, c, max(options.requests, 2 * c) if options.sweep else options.requests)
        for w in options.workloads for c in clients]
    apply_cache_environment()
    prepare(SMOLLM2)
    results = {}
    for target in options.targets:
        if target == "probserve":
            results[target] = run_probserve(options.config, plan, options.rate, options.time_limit)
        elif target == "ray-serve-llm":
            results[target] = run_ray_serve_llm(plan, options.rate, options.time_limit)
        else:
            results[target] = run_vllm(plan, options.rate, options.time_limit, target == "vllm")
    print_table(results)
    print_ratios(results)


def print_table(results: dict) -> None:
    """Every target's runs: rates, latencies, refusals and CPU per request, for the docs."""
    print("| target | workload | clients | answered/s | p50 | p99 | refused | CPU ms/request |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- |")
    for target, runs in results.items():
        for (workload, clients), report in runs.items():
            refused = sum(n for status, n in report["statuses"].items() if status != 200)
            print(f"| {target} | {workload} | {clients} | {report['req/s']:.1f} | {report['p50']:.2f} s | "
                  f"{report['p99']:.2f} s | {refused} | {sum(report['cpu_ms'].values()):.1f} |")


def print_ratios(results: dict) -> None:
    """probserve against each peer that ran: request rates and CPU per request."""
    ours = results.get("probserve")
    for baseline in (name for name in results if name != "probserve" and ours):
        print(f"| workload | concurrency | {baseline} | probserve | ratio | CPU ms/request "
              f"({baseline} / probserve) |\n| --- | --- | --- | --- | --- | --- |")
        for key, theirs in results[baseline].items():
            mine = ours[key]
            print(f"| {key[0]} | {key[1]} | {theirs['req/s']:.1f} req/s | {mine['req/s']:.1f} req/s | "
                  f"{mine['req/s'] / theirs['req/s']:.2f}x | {sum(theirs['cpu_ms'].values()):.1f} / "
                  f"{sum(mine['cpu_ms'].values()):.1f} |")


if __name__ == "__main__":
    main()
