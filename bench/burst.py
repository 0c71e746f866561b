"""A burst: small requests and full-vocabulary ones, all sent at the same moment to probserve
on the embedded SmolLM2. Every request must be answered or refused (503 with Retry-After)
within a bound in time, and the small ones must not wait behind the full-vocabulary work.

Reports, for each kind: answered and refused, the latest answer and the latest refusal
(seconds from the burst), the answers' p50 and p99.

    .venv/bin/python bench/burst.py                       # 300 small, 12 full-vocabulary (256 ids)
    .venv/bin/python bench/burst.py --small 300 --full-vocab 12 --config deployments/local.yaml
"""

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import httpx
from load import PORT, small

from probserve.ops import cli, local_ray
from probserve.store.home import apply_cache_environment
from probserve.store.model_store import SMOLLM2, prepare

FULL_VOCAB_IDS = list(range(3000, 3256))


def full_vocab_256() -> dict:
    return {"prompt": FULL_VOCAB_IDS, "max_tokens": 1, "prompt_logprobs": -1}


async def timed(client: httpx.AsyncClient, body: dict) -> tuple[int | str, float]:
    """The status (or the transport error's name) and the seconds to the body's last byte."""
    started = time.perf_counter()
    try:
        response = await client.post("/v1/completions", headers={"accept-encoding": "gzip"},
                                     json={"model": SMOLLM2, "temperature": 0, **body})
        await response.aread()
        status = response.status_code
    except httpx.HTTPError as error:
        status = type(error).__name__
    return status, time.perf_counter() - started


async def burst(url: str, kinds: dict[str, tuple[int, dict]], timeout_s: float) -> dict:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits) as client:
        await asyncio.gather(*(timed(client, small()) for _ in range(4)))  # warm-up
        tasks = {kind: [asyncio.create_task(timed(client, body)) for _ in range(count)]
                 for kind, (count, body) in kinds.items()}
        return {kind: await asyncio.gather(*sent) for kind, sent in tasks.items()}


def summary(kind: str, outcomes: list[tuple]) -> str:
    answered = sorted(seconds for status, seconds in outcomes if status == 200)
    refused = sorted(seconds for status, seconds in outcomes if status == 503)
    other = [status for status, _ in outcomes if status not in (200, 503)]
    p99 = answered[min(len(answered) - 1, int(len(answered) * 0.99))] if answered else float("nan")
    return (f"| {kind} | {len(outcomes)} | {len(answered)} | {len(refused)} | {len(other)} | "
            f"{max(answered, default=float('nan')):.2f} s | {max(refused, default=float('nan')):.2f} s | "
            f"{statistics.median(answered) if answered else float('nan'):.2f} s | {p99:.2f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=300)
    parser.add_argument("--full-vocab", type=int, default=12)
    parser.add_argument("--timeout", type=float, default=120, help="seconds a client waits at most")
    parser.add_argument("--config", type=Path, default=Path("deployments/local.yaml"))
    options = parser.parse_args()
    apply_cache_environment()
    prepare(SMOLLM2)
    args, _, _ = cli.serve_config(options.config)
    url = local_ray.start(args, port=PORT, log_to_driver=False)
    try:
        kinds = {"small": (options.small, small()),
                 "full vocabulary, 256 ids": (options.full_vocab, full_vocab_256())}
        outcomes = asyncio.run(burst(url, kinds, options.timeout))
    finally:
        local_ray.stop()
    print("| requests | sent | answered | refused | other | last answer | last refusal | p50 answered "
          "| p99 answered |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for kind, outcome in outcomes.items():
        print(summary(kind, outcome))


if __name__ == "__main__":
    main()
