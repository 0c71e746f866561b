"""vLLM's engine start and request rate on the CPU, with the model in a third process (vLLM's
multiprocessing executor, its CPU default, what a probserve replica runs) and in the
engine-core process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`). Each run is a fresh interpreter,
outside Ray, with the replica's engine arguments, alternating between the two, so both see the
same machine.

Reports, per setting: seconds to import vLLM, to start the engine, and small requests per
second (5-token prompts, `max_tokens: 1`, `logprobs: 5`, 16 in flight), the median of the runs.

    .venv/bin/python bench/engine_start.py
    .venv/bin/python bench/engine_start.py --model smollm2-135m-instruct --runs 5
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

SETTINGS = {"third process (vLLM's CPU default, probserve)": "1", "engine-core process": "0"}


async def measure(model_name: str, requests: int) -> dict:
    """In a fresh interpreter: the import, the engine's start, then the small requests."""
    from serve_app.config import ModelConfig
    from serve_app.engine.vllm_adapter import engine_args, prepare_process

    model = ModelConfig(name=model_name)
    prepare_process(model)  # caches and CPU settings, before vLLM reads them
    started = time.monotonic()
    from vllm import SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM
    imported = time.monotonic()
    engine = AsyncLLM.from_engine_args(engine_args(model))
    ready = time.monotonic()
    in_flight = asyncio.Semaphore(16)

    async def one(index: int) -> None:
        async with in_flight:
            async for _ in engine.generate(list(range(10, 15)), SamplingParams(max_tokens=1, logprobs=5),
                                           request_id=str(index)):
                pass
    await one(-1)  # the first request's one-off costs stay out of the rate
    sent = time.monotonic()
    await asyncio.gather(*(one(index) for index in range(requests)))
    rate = requests / (time.monotonic() - sent)
    engine.shutdown()
    return {"import_s": imported - started, "start_s": ready - imported, "requests_per_s": rate}


def run(model: str, requests: int, multiprocessing: str) -> dict:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": multiprocessing}
    done = subprocess.run([sys.executable, __file__, "--measure", model, "--requests", str(requests)],
                          env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama", help="a model of the store, prepared")
    parser.add_argument("--runs", type=int, default=3, help="runs of each setting")
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(asyncio.run(measure(args.measure, args.requests))))
        return
    runs = {name: [] for name in SETTINGS}
    for _ in range(args.runs):
        for name, multiprocessing in SETTINGS.items():
            runs[name].append(run(args.model, args.requests, multiprocessing))
    print(f"{args.model}, median of {args.runs} runs each\n")
    print("| the model runs in | import vLLM (s) | engine start (s) | requests/s |")
    print("|---|---|---|---|")
    for name, results in runs.items():
        medians = [statistics.median(result[field] for result in results)
                   for field in ("import_s", "start_s", "requests_per_s")]
        print(f"| {name} | {medians[0]:.1f} | {medians[1]:.1f} | {medians[2]:.0f} |")


if __name__ == "__main__":
    main()
