"""Fair sharing under a flood, timed: probserve on the embedded SmolLM2 (deployments/local.yaml)
with two ingress replicas and two tenants, flood (one request in flight per ingress replica,
the others waiting in its own queue) and beta (no limits), both sending the very same request.
Reports beta's median latency idle and while flood's clients each send again as soon as they
have an answer, and flood's own median: the figures of docs/tenancy.md, "Fair sharing".
tests/e2e/test_tenancy.py asserts the bound itself (flood's requests in the engine at once).

    .venv/bin/python bench/tenant_flood.py                  # 8 flood clients, 11 beta requests
    .venv/bin/python bench/tenant_flood.py --clients 16 --requests 21
"""

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from load import probserve_serving

from serve_app.store.model_store import SMOLLM2
from serve_app.tenants import keyring
from serve_app.tenants.keyring import KeyFile, Tenant, TenantLimits

REQUEST = {"model": SMOLLM2, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
INGRESS_REPLICAS = 2
FLOOD_LIMIT_S = 600  # a flood client stops by then, whatever happens
FLOOD_START_S = 120  # every flood client answered once by then


def tenancy(folder: Path, clients: int) -> tuple[dict, dict[str, str]]:
    """flood's and beta's keys, and the tenancy section that holds them."""
    secret_file, key_file = folder / "secret", folder / "keys.yaml"
    secret_file.write_text(keyring.new_secret())
    flood = Tenant(limits=TenantLimits(max_in_flight=1, max_waiting=clients))
    document, keys = KeyFile(tenants={"flood": flood, "beta": Tenant()}), {}
    for name in ("flood", "beta"):
        document, keys[name] = keyring.create_key(document, name, keyring.read_secret(secret_file))
    document.write(key_file)
    return {"key_file": str(key_file), "secret_file": str(secret_file)}, keys


async def latency(client: httpx.AsyncClient, key: str) -> float:
    """Seconds to the answer of one REQUEST, which must be a 200."""
    started = time.perf_counter()
    response = await client.post("/v1/completions", json=REQUEST, headers={"authorization": f"Bearer {key}"})
    response.raise_for_status()
    return time.perf_counter() - started


async def flood_client(client: httpx.AsyncClient, key: str, stop: asyncio.Event, latencies: list) -> None:
    deadline = time.monotonic() + FLOOD_LIMIT_S
    while not stop.is_set() and time.monotonic() < deadline:
        latencies.append(await latency(client, key))


async def measure(url: str, keys: dict[str, str], clients: int, requests: int) -> dict[str, float]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        idle = [await latency(client, keys["beta"]) for _ in range(requests)]
        stop, flooded = asyncio.Event(), []
        flood = [asyncio.create_task(flood_client(client, keys["flood"], stop, flooded))
                 for _ in range(clients)]
        started = time.monotonic()
        while len(flooded) < clients:  # the flood is going: its queues hold waiters
            if time.monotonic() - started > FLOOD_START_S:
                raise TimeoutError(f"{len(flooded)} flood answers in {FLOOD_START_S} s")
            await asyncio.sleep(0.1)
        busy = [await latency(client, keys["beta"]) for _ in range(requests)]
        stop.set()
        await asyncio.gather(*flood)
    return {"idle": statistics.median(idle), "busy": statistics.median(busy),
            "flood": statistics.median(flooded), "flood requests": len(flooded)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8, help="flood's clients")
    parser.add_argument("--requests", type=int, default=11, help="beta's, idle and under the flood")
    parser.add_argument("--config", type=Path, default=Path("deployments/local.yaml"))
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        section, keys = tenancy(Path(scratch), options.clients)
        ingress = {"autoscaling_config": {"min_replicas": INGRESS_REPLICAS, "max_replicas": INGRESS_REPLICAS}}
        with probserve_serving(options.config, {"tenancy": section, "ingress": ingress}) as url:
            figures = asyncio.run(measure(url, keys, options.clients, options.requests))
    print(f"beta's median latency: idle {figures['idle']:.3f} s, under the flood {figures['busy']:.3f} s "
          f"({figures['busy'] / figures['idle']:.2f}x); flood's {figures['flood requests']} requests: "
          f"median {figures['flood']:.3f} s")


if __name__ == "__main__":
    main()
