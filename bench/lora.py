"""LoRA adapters: what serving them costs, against the base model alone and against vLLM's own
server with the same adapters.

Two measurements, each of 16 clients sending small requests of prompts never sent before
(`distinct` of bench/load.py):

- `enable`: requests to the model of probserve on `--config` as it is, and to the same model
  with `lora` turned on (rank up to 16, no adapter used), both served at once and loaded in
  turn `--rounds` times (this machine's speed moves within minutes): what turning LoRA on
  costs requests that use none. It decides whether deployments/local.yaml serves adapters.
- `spread`: requests spread in turn over the base and four adapters of the embedded model
  (the store's rank-8 and rank-16 adapters and two more rank-8 ones, seeded, built here),
  against requests to the base alone, on probserve (the adapters loaded at run time) and on
  vLLM's server (`--enable-lora --lora-modules`), each with `max_loras` 4.

    .venv/bin/python bench/lora.py --measure enable --rounds 8
    .venv/bin/python bench/lora.py --measure spread --requests 400
"""

import argparse
import asyncio
import itertools
import shutil
import statistics
from pathlib import Path

import httpx
from load import PORT, QUESTIONS, closed_loop, distinct, probserve_serving
from servers import vllm_server

from serve_app.ops import local_ray
from serve_app.store.adapter_store import StoreAdapter, adapter_name, build_adapter
from serve_app.store.home import adapters_dir, apply_cache_environment
from serve_app.store.model_store import SMOLLM2, embedded_model_path, prepare

CLIENTS = 16
LORA = {"max_lora_rank": 16, "max_loras": 4}
BUILT_SEEDS = (71, 72)  # the two adapters built here, beside the store's two
LORA_TWIN = f"{SMOLLM2}-with-lora"


def with_lora(config: Path, beside: bool = False) -> dict:
    """The config's model sections with LoRA turned on (for probserve_serving); `beside`: the
    model as it is, and beside it the same model under LORA_TWIN with LoRA on."""
    from serve_app.ops import cli

    args, _, _ = cli.serve_config(config)
    models = args["models"]
    if not beside:
        return {"models": [{**model, "lora": LORA} for model in models]}
    (model,) = models
    twin = {**model, "name": LORA_TWIN, "path": str(embedded_model_path(SMOLLM2)), "lora": LORA}
    return {"models": [model, twin]}


def rate(url: str, models: list[str], requests: int, seed: int) -> float:
    """Answered requests a second: `requests` distinct prompts from CLIENTS clients, each
    request to the next of `models` in turn."""
    turn = itertools.cycle(models)
    QUESTIONS.start(seed)
    run = asyncio.run(closed_loop(url, models[0], lambda: {**distinct(), "model": next(turn)},
                                  CLIENTS, requests, time_limit=600))
    assert set(run.statuses) == {200}, (run.statuses, run.errors)
    return run.statuses[200] / run.seconds


def measure_enable(config: Path, rounds: int, requests: int) -> None:
    """One service serving the model twice, as configured and with LoRA on: each round
    loads one then the other, so that both meet the machine's same moment."""
    ratios = []
    with probserve_serving(config, with_lora(config, beside=True)) as url:
        for model in (SMOLLM2, LORA_TWIN):
            rate(url, [model], 32, seed=999)  # warm-up
        for round_ in range(rounds):
            first, second = (SMOLLM2, LORA_TWIN) if round_ % 2 == 0 else (LORA_TWIN, SMOLLM2)
            rates = {model: rate(url, [model], requests, seed=round_) for model in (first, second)}
            ratios.append(rates[LORA_TWIN] / rates[SMOLLM2])
            print(f"round {round_ + 1}: without LoRA {rates[SMOLLM2]:.1f} req/s, with LoRA "
                  f"{rates[LORA_TWIN]:.1f} req/s: {ratios[-1]:.3f}x", flush=True)
    print(f"median with / without LoRA: {statistics.median(ratios):.3f}x over {rounds} rounds "
          f"(lowest {min(ratios):.3f}x, highest {max(ratios):.3f}x)")


def four_adapters() -> dict[str, Path]:
    """The store's two adapters of the embedded model and two more built under the adapter
    root (removed by the caller)."""
    folders = {name: prepare(name) for name in (adapter_name(SMOLLM2, 8), adapter_name(SMOLLM2, 16))}
    for seed in BUILT_SEEDS:
        folder = adapters_dir() / f"bench-{SMOLLM2}-lora-{seed}"
        folder.mkdir(parents=True, exist_ok=True)
        build_adapter(folder, embedded_model_path(SMOLLM2), StoreAdapter(SMOLLM2, 8), seed=seed)
        folders[folder.name] = folder
    return folders


def spread_rates(url: str, adapters: list[str], requests: int) -> dict[str, float]:
    rate(url, [SMOLLM2, *adapters], 40, seed=999)  # warm-up: every adapter loaded
    return {"base alone": rate(url, [SMOLLM2], requests, seed=1),
            "base and 4 adapters": rate(url, [SMOLLM2, *adapters], requests, seed=2)}


def measure_spread(config: Path, requests: int) -> None:
    folders = four_adapters()
    try:
        results = {"probserve": probserve_spread(config, folders, requests),
                   "vLLM's server": vllm_spread(folders, requests)}
    finally:
        for folder in folders.values():
            if folder.name.startswith("bench-"):
                shutil.rmtree(folder)
    print("| server | base alone | base and 4 adapters | ratio |\n| --- | --- | --- | --- |")
    for server, rates in results.items():
        alone, spread = rates["base alone"], rates["base and 4 adapters"]
        print(f"| {server} | {alone:.1f} req/s | {spread:.1f} req/s | {spread / alone:.2f}x |")
    ours, theirs = results["probserve"], results["vLLM's server"]
    print(f"probserve / vLLM: base alone {ours['base alone'] / theirs['base alone']:.2f}x, "
          f"spread {ours['base and 4 adapters'] / theirs['base and 4 adapters']:.2f}x")


def probserve_spread(config: Path, folders: dict[str, Path], requests: int) -> dict[str, float]:
    print(f"probserve ({config}, LoRA on, the adapters loaded at run time):", flush=True)
    with probserve_serving(config, with_lora(config)) as url:
        for name, folder in folders.items():
            loaded = httpx.post(f"{url}/v1/load_lora_adapter", timeout=60,
                                json={"lora_name": name, "lora_path": str(folder)})
            assert loaded.status_code == 200, loaded.text
        rates = spread_rates(url, list(folders), requests)
    print(f"  {rates}", flush=True)
    return rates


def vllm_spread(folders: dict[str, Path], requests: int) -> dict[str, float]:
    print("vLLM's OpenAI server (tuned, --enable-lora):", flush=True)
    modules = [f"{name}={folder}" for name, folder in folders.items()]
    server = vllm_server(PORT, kv_cache_gib=1, extra=(
        "--enable-lora", "--max-lora-rank", str(LORA["max_lora_rank"]), "--max-loras", str(LORA["max_loras"]),
        "--lora-modules", *modules))
    try:
        local_ray.wait_healthy(f"http://127.0.0.1:{PORT}")
        rates = spread_rates(f"http://127.0.0.1:{PORT}", list(folders), requests)
    finally:
        server.terminate()
        server.wait()
    print(f"  {rates}", flush=True)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", choices=["enable", "spread"], required=True)
    parser.add_argument("--rounds", type=int, default=8, help="enable: runs of each model, alternated")
    parser.add_argument("--requests", type=int, default=400, help="a run's requests")
    parser.add_argument("--config", type=Path, default=Path("deployments/local.yaml"))
    options = parser.parse_args()
    apply_cache_environment()
    prepare(SMOLLM2)
    if options.measure == "enable":
        measure_enable(options.config, options.rounds, options.requests)
    else:
        measure_spread(options.config, options.requests)


if __name__ == "__main__":
    main()
