"""Slow clients: one client reads a full-vocabulary body at a fixed rate (1 MB/s by default)
while others send small requests; does the service hold the unread body, and does the slow
reader hold the others back?

For each HTTP front (HAProxy with the ingress replicas serving HTTP themselves, or Ray Serve's
Python proxy), probserve on the embedded SmolLM2 is started, and every second of the slow read
reports the bytes the client has read, the serializer pool's CPU seconds so far (does the pool
write at the client's pace, or ahead of it?) and the resident memory of the front, the ingress
and the whole service. Small requests' latency during the read is against the same before it.
Then a client that leaves such a body after its first bytes: the pool's CPU seconds in the
few seconds after (a pool that went on writing the body would spend seconds of both workers),
and the service's resident memory then against before.

    .venv/bin/python bench/slow_client.py                          # both fronts, 1 MB/s
    .venv/bin/python bench/slow_client.py --fronts haproxy --rate-mb 0.5 --ids 128
"""

import argparse
import asyncio
import collections
import os
import time
from pathlib import Path

import httpx
import psutil
from cpu import process_role
from load import distinct, median_and_p99, probserve_serving

from serve_app.ops import local_ray
from serve_app.store.model_store import SMOLLM2

FRONTS = {"haproxy": "1", "python": "0"}  # RAY_SERVE_ENABLE_HA_PROXY
MB = 1_000_000


def by_role() -> dict[str, tuple[float, float]]:
    """CPU seconds and resident MB of the service's processes, summed by role."""
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for process in psutil.Process().children(recursive=True):
        try:
            role = process_role(" ".join(process.cmdline()))
            times, rss = process.cpu_times(), process.memory_info().rss
        except psutil.Error:
            continue
        totals[role][0] += times.user + times.system
        totals[role][1] += rss / MB
    return {role: (cpu, rss) for role, (cpu, rss) in totals.items()}


async def small_latencies(client: httpx.AsyncClient, seconds: float, clients: int = 4) -> list[float]:
    """Latencies of small requests sent back to back by `clients` clients for `seconds`."""
    latencies, deadline = [], time.perf_counter() + seconds

    async def one_client():
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            response = await client.post("/v1/completions", json={"model": SMOLLM2, **distinct()})
            assert response.status_code == 200, response.text
            latencies.append(time.perf_counter() - started)
    await asyncio.gather(*(one_client() for _ in range(clients)))
    return latencies


async def slow_read(client: httpx.AsyncClient, ids: int, rate: float, samples: list) -> float:
    """Reads a gzip full-vocabulary body at `rate` bytes a second, sampling the service every
    second; returns the seconds the read took."""
    body = {"model": SMOLLM2, "prompt": list(range(3000, 3000 + ids)), "max_tokens": 1,
            "prompt_logprobs": -1}
    started, read, next_sample = time.perf_counter(), 0, 0.0
    async with client.stream("POST", "/v1/completions", json=body,
                             headers={"accept-encoding": "gzip"}) as response:
        assert response.status_code == 200
        async for piece in response.aiter_raw(65536):
            read += len(piece)
            elapsed = time.perf_counter() - started
            if elapsed >= next_sample:
                samples.append((elapsed, read, by_role()))
                next_sample += 1.0
            await asyncio.sleep(max(0.0, read / rate - elapsed))
    samples.append((time.perf_counter() - started, read, by_role()))
    return time.perf_counter() - started


async def left_early(client: httpx.AsyncClient, ids: int, seconds: float = 3.0) -> tuple[float, float]:
    """A client that leaves a full-vocabulary body (ids of its own, not cached) after its
    first bytes: the pool's CPU seconds in the `seconds` after, and the service's resident MB
    then less before."""
    body = {"model": SMOLLM2, "prompt": list(range(4000, 4000 + ids)), "max_tokens": 1,
            "prompt_logprobs": -1}
    before = by_role()
    async with client.stream("POST", "/v1/completions", json=body,
                             headers={"accept-encoding": "identity"}) as response:
        assert response.status_code == 200
        await anext(response.aiter_raw())
    left = by_role()
    await asyncio.sleep(seconds)
    after = by_role()
    pool = after.get("SerializerPool", (0.0, 0.0))[0] - left.get("SerializerPool", (0.0, 0.0))[0]
    return pool, sum(rss for _, rss in after.values()) - sum(rss for _, rss in before.values())


def report(front: str, samples: list, before: list[float], during: list[float]) -> None:
    start_cpu = samples[0][2].get("SerializerPool", (0.0, 0.0))[0]
    (before_p50, before_p99), (during_p50, during_p99) = median_and_p99(before), median_and_p99(during)
    print(f"\n{front}: small requests p50/p99 before {before_p50:.3f}/{before_p99:.3f} s, during "
          f"the slow read {during_p50:.3f}/{during_p99:.3f} s")
    print("| second | MB read | pool CPU s | front MB | ingress MB | service MB |\n"
          "| --- | --- | --- | --- | --- | --- |")
    shown = samples[::max(1, len(samples) // 12)]
    for elapsed, read, roles in shown + samples[-1:] if shown[-1] is not samples[-1] else shown:
        front_mb = sum(rss for role, (_, rss) in roles.items() if role in ("HAProxy", "Serve proxy"))
        print(f"| {elapsed:.0f} | {read / MB:.1f} | "
              f"{roles.get('SerializerPool', (0.0, 0.0))[0] - start_cpu:.1f} | {front_mb:.0f} | "
              f"{roles.get('Ingress', (0.0, 0.0))[1]:.0f} | {sum(rss for _, rss in roles.values()):.0f} |")


async def measure(url: str, ids: int, rate: float) -> tuple[list, list[float], list[float], tuple]:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await small_latencies(client, 3)  # warm-up
        before = await small_latencies(client, 10)
        samples: list = []
        reading = asyncio.create_task(slow_read(client, ids, rate, samples))
        during = await small_latencies(client, 20)
        await reading
        return samples, before, during, await left_early(client, ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fronts", nargs="+", choices=sorted(FRONTS), default=sorted(FRONTS))
    parser.add_argument("--ids", type=int, default=256, help="prompt tokens of the slow body")
    parser.add_argument("--rate-mb", type=float, default=1.0, help="the slow client's MB a second")
    parser.add_argument("--config", type=Path, default=Path("deployments/local.yaml"))
    options = parser.parse_args()
    for front in options.fronts:
        os.environ[local_ray.HAPROXY] = FRONTS[front]
        with probserve_serving(options.config) as url:
            samples, before, during, (pool_cpu, memory) = asyncio.run(
                measure(url, options.ids, options.rate_mb * MB))
        report(front, samples, before, during)
        print(f"{front}: a client that left after the first bytes: pool CPU {pool_cpu:.2f} s in "
              f"the 3 s after, service memory {memory:+.0f} MB")


if __name__ == "__main__":
    main()
