"""A burst: small requests (each of a prompt of its own) and full-vocabulary ones, all sent at
the same moment to probserve on the embedded SmolLM2. Every request must be answered or refused
(503 with Retry-After) within a bound in time, and the small ones must not wait behind the
full-vocabulary work.

Reports, for each kind: answered and refused, the latest answer's first byte and last byte,
the latest refusal (seconds from the burst), the answers' p50 and p99 to the last byte.

    .venv/bin/python bench/burst.py                       # 300 small, 12 full-vocabulary (256 ids)
    .venv/bin/python bench/burst.py --in-turn             # the small ones first
    .venv/bin/python bench/burst.py --small 300 --full-vocab 12 --config deployments/local.yaml
    .venv/bin/python bench/burst.py --engine-speed 0.5    # vLLM's processes at half speed
"""

import argparse
import asyncio
import collections
import json
import random
import re
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from load import distinct, median_and_p99, probserve_serving
from slowdown import slowed, vllm_processes

from serve_app.store.model_store import SMOLLM2

FULL_VOCAB_IDS = list(range(3000, 3256))
WARM_UP = 8


def full_vocab_256() -> dict:
    return {"prompt": FULL_VOCAB_IDS, "max_tokens": 1, "prompt_logprobs": -1}


async def timed(client: httpx.AsyncClient, body: dict) -> tuple[int | str, float, float, str]:
    """The status (or the transport error's name), the seconds to the body's first byte and
    to its last, and a refusal's message."""
    started = time.perf_counter()
    first_byte, message = float("nan"), ""
    try:
        async with client.stream("POST", "/v1/completions", headers={"accept-encoding": "gzip"},
                                 json={"model": SMOLLM2, "temperature": 0, **body}) as response:
            if response.status_code != 200:
                message = refusal_message(await response.aread())
            else:  # raw: the client's gunzip would take the cores the service runs on
                chunks = response.aiter_raw()
                await anext(chunks, b"")
                first_byte = time.perf_counter() - started
                async for _ in chunks:
                    pass
        status = response.status_code
    except httpx.HTTPError as error:
        status, message = type(error).__name__, str(error)
    return status, first_byte, time.perf_counter() - started, message


def refusal_message(body: bytes) -> str:
    """The error envelope's message, or the body itself if it is not one."""
    try:
        return json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return f"not an error envelope: {body[:200]!r}"


async def burst(url: str, kinds: dict[str, tuple[int, Callable[[], dict]]], timeout_s: float,
                mixed: bool) -> dict:
    """Every request of every kind sent at once (each kind's bodies made by its function): the
    kinds in turn, or mixed in a random (seeded) order."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=timeout_s, limits=limits) as client:
        for _ in range(WARM_UP):  # one at a time: the replica measures its engine's pace
            await timed(client, distinct())
        order = [kind for kind, (count, _) in kinds.items() for _ in range(count)]
        if mixed:
            random.Random(0).shuffle(order)
        sent = [(kind, asyncio.create_task(timed(client, kinds[kind][1]()))) for kind in order]
        outcomes: dict[str, list] = {kind: [] for kind in kinds}
        for kind, task in sent:
            outcomes[kind].append(await task)
        return outcomes


def summary(kind: str, outcomes: list[tuple]) -> str:
    answered = sorted(last for status, _, last, _ in outcomes if status == 200)
    first_bytes = [first for status, first, _, _ in outcomes if status == 200]
    refused = [last for status, _, last, _ in outcomes if status == 503]
    other = [status for status, _, _, _ in outcomes if status not in (200, 503)]
    p50, p99 = median_and_p99(answered)
    latest = max(first_bytes, default=float("nan")), max(answered, default=float("nan"))
    return (f"| {kind} | {len(outcomes)} | {len(answered)} | {len(refused)} | {len(other)} | "
            f"{latest[0]:.2f} / {latest[1]:.2f} s | {max(refused, default=float('nan')):.2f} s | "
            f"{p50:.2f} s | {p99:.2f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=300)
    parser.add_argument("--full-vocab", type=int, default=12)
    parser.add_argument("--in-turn", action="store_true",
                        help="send the kinds in turn (all small first) instead of mixed")
    parser.add_argument("--timeout", type=float, default=120, help="seconds a client waits at most")
    parser.add_argument("--config", type=Path, default=Path("deployments/local.yaml"))
    parser.add_argument("--engine-speed", type=float, default=1.0,
                        help="the share of each 50 ms vLLM's processes run (bench/slowdown.py): 0.5 "
                        "is an engine on a machine half as fast")
    options = parser.parse_args()
    kinds = {"small": (options.small, distinct),
             "full vocabulary, 256 ids": (options.full_vocab, full_vocab_256)}
    with probserve_serving(options.config) as url, slowed(vllm_processes(), options.engine_speed):
        outcomes = asyncio.run(burst(url, kinds, options.timeout, mixed=not options.in_turn))
    print("| requests | sent | answered | refused | other | last answer, first / last byte | last refusal "
          "| p50 answered | p99 answered |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for kind, outcome in outcomes.items():
        print(summary(kind, outcome))
    for kind, outcome in outcomes.items():
        refusals = collections.Counter(f"{status} " + re.sub(r"\d+(\.\d+)?", "N", message)
                                       for status, _, _, message in outcome if status != 200)
        for message, count in refusals.most_common():
            print(f"{kind}: {count} x {message}")


if __name__ == "__main__":
    main()
