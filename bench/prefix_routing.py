"""Routing by prefix across replicas: the same evaluation suite and the same production
traffic on one replica of SmolLM2, on two routed by prefix (probserve's models' router) and
on two routed as Ray Serve routes (its two random choices, `prefix_routing.enabled: false`),
the three models served at once, run in turn, so each sees the same machine.

- harness: multiple-choice questions (bench/shared_context.py's mmlu: a context of about 650
  tokens, four choices of one to three words) sent as lm-evaluation-harness sends them: a
  question's four choices in one request (`echo`, `logprobs: 1`), four questions at once;
- choices: the same as bench/shared_context.py sends them: each choice a request of its own
  (`echo`), eight in flight, in question order.

  Each run on contexts of its own. Reported: the share of the prompt tokens the engines
  computed (`probserve_prefill_tokens_total` over `probserve_prompt_tokens_total`) and the time.
- distinct: bench/load.py's small requests of a prompt each, at 16 and 64 clients, on the two
  two-replica models: requests a second, p50 and p99, and each replica's share of the prompt
  tokens.

    .venv/bin/python bench/prefix_routing.py
    .venv/bin/python bench/prefix_routing.py --rounds 3 --questions 32
"""

import argparse
import asyncio
import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from load import WORKLOADS, closed_loop, probserve_serving
from shared_context import questions
from shared_context import run as choices_run
from transformers import AutoTokenizer

from serve_app.ops import cli, local_ray
from serve_app.store.model_store import SMOLLM2, embedded_model_path

AT_ONCE = 4
SHAPES = ("harness", "choices")
# The models: SmolLM2 each, one replica or two, routed by prefix or not; each replica a
# quarter of Ray's logical CPUs, so that five fit on a small machine (vLLM's threads use every
# core whatever Ray counts).
LAYOUTS = {"one replica": (1, True), "two, by prefix": (2, True), "two, Serve's choices": (2, False)}
METRIC = r'^ray_probserve_{counter}_total{{([^}}]*model="{model}"[^}}]*)}} (\S+)$'


def model_name(layout: str) -> str:
    return "smollm2-" + re.sub(r"[^a-z0-9]+", "-", layout.lower()).strip("-")


def models(base: dict) -> list[dict]:
    return [{**base, "name": model_name(layout), "path": str(embedded_model_path(SMOLLM2)),
             "autoscaling_config": {"min_replicas": replicas, "max_replicas": replicas},
             "prefix_routing": {"enabled": routed}, "cpu_kv_cache_gib": 0.5,
             "ray_actor_options": {"num_cpus": 0.25}}
            for layout, (replicas, routed) in LAYOUTS.items()]


def by_replica(metrics_url: str, counter: str, model: str) -> dict[str, float]:
    """A model replica counter as Ray exports it, by series (one a replica process)."""
    text = httpx.get(metrics_url, timeout=30).text
    pattern = METRIC.format(counter=counter, model=re.escape(model))
    return {labels: float(value) for labels, value in re.findall(pattern, text, re.MULTILINE)}


def settled(metrics_url: str, counter: str, model: str) -> dict[str, float]:
    """The counter once a reading 3 s after the last brought nothing new (Ray reports every few)."""
    value = by_replica(metrics_url, counter, model)
    while True:
        time.sleep(3)
        value, previous = by_replica(metrics_url, counter, model), value
        if value == previous:
            return value


def grown(before: dict[str, float], after: dict[str, float]) -> list[float]:
    return [value - before.get(series, 0.0) for series, value in after.items()]


def harness(url: str, model: str, work: list) -> float:
    """Each question's choices in one request, AT_ONCE questions in flight: the wall time."""
    def ask(question) -> None:
        context, choices = question
        body = {"model": model, "prompt": [context + choice for choice in choices], "echo": True,
                "max_tokens": 1, "logprobs": 1, "temperature": 0}
        httpx.post(f"{url}/v1/completions", json=body, timeout=600).raise_for_status()
    started = time.perf_counter()
    with ThreadPoolExecutor(AT_ONCE) as pool:
        list(pool.map(ask, work))
    return time.perf_counter() - started


def measured(metrics_url: str, model: str, action) -> tuple[object, list[float], list[float]]:
    """What `action` returns, and the prompt and prefill tokens it added, by replica."""
    prompt, prefill = (settled(metrics_url, counter, model)
                       for counter in ("prompt_tokens", "prefill_tokens"))
    result = action()
    after = settled(metrics_url, "prompt_tokens", model)
    return result, grown(prompt, after), grown(prefill, by_replica(metrics_url, "prefill_tokens", model))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=32, help="per harness run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each model, in turn")
    parser.add_argument("--requests", type=int, default=400, help="per distinct run")
    parser.add_argument("--config", type=Path, default=Path("deployments/local.yaml"))
    options = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_path(SMOLLM2))
    metrics_url = f"http://127.0.0.1:{local_ray.METRICS_PORT}/metrics"
    base = first_model(options.config)
    harness_runs = {(layout, shape): [] for layout in LAYOUTS for shape in SHAPES}
    load_runs = {(layout, clients): [] for layout in list(LAYOUTS)[1:] for clients in (16, 64)}
    # The ingress takes what five replicas take and queue.
    sections = {"models": models(base), "ingress": {"max_ongoing_requests": 2048}}
    with probserve_serving(options.config, sections) as url:
        seed = iter(range(1, 1000))
        for _ in range(options.rounds):
            for layout, shape in harness_runs:
                name = model_name(layout)
                work = questions(tokenizer, "mmlu", options.questions, seed=next(seed))
                send = (lambda: harness(url, name, work)) if shape == "harness" else \
                    (lambda: asyncio.run(choices_run(url, "harness", work, name))[0])
                seconds, prompt, prefill = measured(metrics_url, name, send)
                harness_runs[layout, shape].append((seconds, sum(prefill) / sum(prompt)))
                print(f"{shape}, {layout}: {seconds:.1f} s, {sum(prefill) / sum(prompt):.1%} computed",
                      flush=True)
            for (layout, clients), runs in load_runs.items():
                name = model_name(layout)
                run, prompt, _ = measured(metrics_url, name, lambda: asyncio.run(closed_loop(
                    url, name, WORKLOADS["distinct"], clients, options.requests, 600)).report())
                runs.append((run, [tokens / sum(prompt) for tokens in prompt]))
                print(f"distinct, {layout}, {clients} clients: {run['req/s']:.1f} req/s, "
                      f"p99 {run['p99']:.2f} s, replicas' shares {shares(prompt)}", flush=True)
    report(harness_runs, load_runs)


def first_model(config: Path) -> dict:
    """The file's first model's settings, for each layout's SmolLM2."""
    args, _, _ = cli.serve_config(config)
    return {key: value for key, value in args["models"][0].items() if key not in ("name", "path")}


def shares(prompt: list[float]) -> str:
    total = sum(prompt)
    return " / ".join(f"{tokens / total:.0%}" for tokens in sorted(prompt, reverse=True))


def report(harness_runs: dict, load_runs: dict) -> None:
    print("\n| model | shape | prompt tokens computed | time |")
    print("| --- | --- | --- | --- |")
    for (layout, shape), runs in harness_runs.items():
        print(f"| {layout} | {shape} | {statistics.median(share for _, share in runs):.1%} | "
              f"{statistics.median(seconds for seconds, _ in runs):.1f} s |")
    print("\n| model | clients | distinct: req/s | p50 | p99 | the replicas' shares of the prompt tokens |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (layout, clients), runs in load_runs.items():
        median = {field: statistics.median(run[field] for run, _ in runs)
                  for field in ("req/s", "p50", "p99")}
        spread = " / ".join(f"{statistics.median(sorted(s, reverse=True)[i] for _, s in runs):.0%}"
                            for i in range(2))
        print(f"| {layout} | {clients} | {median['req/s']:.1f} | {median['p50']:.2f} s | "
              f"{median['p99']:.2f} s | {spread} |")


if __name__ == "__main__":
    main()
