"""The model replica alone, called through one Serve handle: no HTTP proxy, no ingress.

What the engine path can reach on this machine, the ceiling under any front end:
- `small` requests one per call, and in batches of 8 and 16 per call (fewer Ray calls);
- 128-token prompts with their prompt log-probabilities (`echo`) and without any (the
  forward pass alone, the bound for any way of scoring them on this engine).

    .venv/bin/python bench/replica_alone.py --requests 600
"""

import argparse
import asyncio
import time

import ray
from ray import serve

from serve_app.config import ModelConfig
from serve_app.engine.replica import ModelReplica
from serve_app.engine.wire import EngineRequest
from serve_app.store.home import apply_cache_environment
from serve_app.store.model_store import SMOLLM2, prepare

CONCURRENCY = 16
CALLER = {"tenant": "bench", "priority": 0}
SMALL = EngineRequest(prompt_token_ids=[504, 3575, 282, 4649, 314], max_tokens=1,
                      temperature=1.0, top_p=1.0, logprobs=5, prompt_logprobs=None, **CALLER)
ECHO = EngineRequest(prompt_token_ids=list(range(1000, 1128)), max_tokens=1, temperature=1.0,
                     top_p=1.0, logprobs=1, prompt_logprobs=1, **CALLER)
FORWARD_ONLY = EngineRequest(prompt_token_ids=ECHO.prompt_token_ids, max_tokens=1,
                             temperature=1.0, top_p=1.0, logprobs=None, prompt_logprobs=None, **CALLER)


@serve.deployment(max_ongoing_requests=64)
class BatchingReplica(ModelReplica.func_or_class):
    """The replica with one more method: several requests in one call."""

    async def generate_batch(self, requests: list) -> list:
        return await asyncio.gather(*(self.generate(r) for r in requests))


async def rate(handle, request: EngineRequest, requests: int, batch: int) -> float:
    """Requests per second with CONCURRENCY requests in flight, `batch` per call."""
    calls = asyncio.Semaphore(CONCURRENCY // batch)

    async def call() -> None:
        async with calls:
            if batch == 1:
                await handle.generate.remote(request)
            else:
                await handle.generate_batch.remote([request] * batch)
    started = time.perf_counter()
    await asyncio.gather(*(call() for _ in range(requests // batch)))
    return requests / (time.perf_counter() - started)


async def measure(handle, requests: int) -> None:
    runs = [("small, 1 per call", SMALL, 1), ("small, 8 per call", SMALL, 8),
            ("small, 16 per call", SMALL, 16), ("echo128 with prompt logprobs", ECHO, 1),
            ("echo128, forward pass only", FORWARD_ONLY, 1)]
    await rate(handle, SMALL, 64, 1)  # warm-up
    for name, request, batch in runs:
        count = requests if request is SMALL else requests // 8
        print(f"| {name} | {CONCURRENCY} | {await rate(handle, request, count, batch):.1f} req/s |",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600)
    options = parser.parse_args()
    apply_cache_environment()
    prepare(SMOLLM2)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        handle = serve.run(BatchingReplica.bind(ModelConfig(name=SMOLLM2)), name="replica-alone",
                           route_prefix=None)
        print("| calls | concurrency | rate |\n| --- | --- | --- |")
        asyncio.run(measure(handle, options.requests))
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
