"""Online traffic first: the online API's latency at a steady load, alone and with a batch
running beside it, on the embedded SmolLM2 (float32), with batch lines at background
priority (`batch.priority: 1`, the default) and, as the baseline in the same run, as equals
of the online requests (`batch.priority: 0`).

For each setting, on a fresh service: the online load alone (bench/load.py's open loop of
small requests at `--rate`, Poisson arrivals), then a batch of `--lines` echo lines of
`--tokens` tokens each through OpenAI's Batch API and, once it runs, the same online load
again; then the batch is waited for. Reports the online p50/p99 of both phases, the p99's
rise, and the batch's lines and prompt tokens per second.

    .venv/bin/python bench/online_first.py
    .venv/bin/python bench/online_first.py --rate 8 --online-requests 240 --lines 400 --tokens 256
"""

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path

import httpx
import orjson
from load import distinct, open_loop, probserve_serving

from serve_app.store.model_store import SMOLLM2

SETTINGS = {"background": 1, "equals": 0}  # batch.priority


def batch_input(lines: int, tokens: int) -> bytes:
    """Echo lines as an evaluation set's, each its own sequence (none read from a cache)."""
    chosen = random.Random(1)
    body = {"model": SMOLLM2, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0}
    return b"".join(orjson.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions",
                                  "body": {**body, "prompt": chosen.sample(range(1000, 40000), tokens)}})
                    + b"\n" for i in range(lines))


def started_batch(client: httpx.Client, content: bytes) -> str:
    uploaded = client.post("/v1/files", files={"file": ("lines.jsonl", content)}, data={"purpose": "batch"})
    batch = client.post("/v1/batches", json={"input_file_id": uploaded.json()["id"],
                                             "endpoint": "/v1/completions", "completion_window": "24h"})
    batch_id = batch.json()["id"]
    while client.get(f"/v1/batches/{batch_id}").json()["status"] == "validating":
        time.sleep(0.2)
    return batch_id


def finished(client: httpx.Client, batch_id: str) -> dict:
    while (batch := client.get(f"/v1/batches/{batch_id}").json())["status"] not in (
            "completed", "failed", "cancelled", "expired"):
        time.sleep(0.5)
    return batch


def online(url: str, options: argparse.Namespace) -> dict:
    random.seed(0)  # the same arrivals in every phase
    return asyncio.run(open_loop(url, SMOLLM2, distinct, options.rate, options.online_requests, 600)).report()


def measure(priority: int, options: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as storage, \
            probserve_serving(options.config, {"batch": {"priority": priority, "storage": storage}}) as url, \
            httpx.Client(base_url=url, timeout=60) as client:
        online(url, options)  # warm-up
        alone = online(url, options)
        started = time.perf_counter()
        batch_id = started_batch(client, batch_input(options.lines, options.tokens))
        beside = online(url, options)
        overlapped = client.get(f"/v1/batches/{batch_id}").json()["status"] == "in_progress"
        assert overlapped, "the batch ended before the online load did: give it more --lines"
        batch = finished(client, batch_id)
        took = time.perf_counter() - started
        counts = batch["request_counts"]
        print(f"  online alone: p50 {alone['p50']:.3f} s, p99 {alone['p99']:.3f} s {alone['statuses']}; "
              f"beside the batch: p50 {beside['p50']:.3f} s, p99 {beside['p99']:.3f} s {beside['statuses']}; "
              f"batch {batch['status']} {counts} in {took:.1f} s", flush=True)
        return {"alone": alone, "beside": beside, "batch_s": took, "batch": counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=8, help="online requests per second")
    parser.add_argument("--online-requests", type=int, default=240, help="per phase")
    parser.add_argument("--lines", type=int, default=400,
                        help="enough to outlast the online load beside it")
    parser.add_argument("--tokens", type=int, default=256, help="per batch line")
    parser.add_argument("--config", type=Path, default=Path("deployments/local.yaml"))
    parser.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=list(SETTINGS),
                        help="the batch priorities to measure, each on a fresh service")
    options = parser.parse_args()
    results = {}
    for name in options.settings:
        priority = SETTINGS[name]
        print(f"batch lines as {name} (priority {priority}):", flush=True)
        results[name] = measure(priority, options)
    print("\n| batch lines | online p50 alone | p99 alone | p50 beside the batch | p99 beside | p99 rise "
          "| batch lines/s | batch tokens/s |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, result in results.items():
        alone, beside = result["alone"], result["beside"]
        lines_per_s = result["batch"]["completed"] / result["batch_s"]
        print(f"| {name} | {alone['p50']:.3f} s | {alone['p99']:.3f} s | {beside['p50']:.3f} s "
              f"| {beside['p99']:.3f} s | {beside['p99'] / alone['p99'] - 1:+.0%} | {lines_per_s:.2f} "
              f"| {lines_per_s * options.tokens:.0f} |")


if __name__ == "__main__":
    main()
