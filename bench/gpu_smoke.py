"""The GPU smoke test (`make gpu-smoke`): one command for a person with one GPU, which shows in a
few minutes that probserve serves right there, and prints one table.

It checks the environment (CUDA, driver, torch, vLLM, the model runner the engine would use),
serves the embedded SmolLM2 with deployments/gpu.yaml's model settings (one replica, no keys),
and compares its answers with a float32 transformers forward pass on the CPU: echo with top-5,
labels at prompt and generated positions, a span that reads the prefix cache a priming request
left, 1,024 positions of the full vocabulary, 32 scoring requests at once with 2 full-vocabulary
ones (the GPU's peak memory meanwhile, from nvidia-smi); then a short load run against
probserve and against vLLM's own server on the same GPU; then SmolLM2 again in vLLM's
batch-invariant mode: each scoring kind alone and among 32 others, bit for bit, and the load
run's throughput against the default mode's. The table goes to stdout and to
`gpu-smoke-<device>.md`.

With several GPUs it serves SmolLM2 split across them (`--gpus`: the most tensor ranks that
divide its heads, or two pipeline stages on two GPUs) and checks it the same way.

On a machine without a GPU it runs the same checks on the CPU (deployments/local.yaml, the CPU
tolerance), the bit-for-bit one on the CPU engine as it is (it has no batch-invariant mode to
turn on): the test suite runs it so against its own service (`--url`), so it cannot rot.

    make gpu-smoke                                # GPU if there is one, else CPU
    PYTHONPATH=. .venv/bin/python bench/gpu_smoke.py --url http://127.0.0.1:8000 --load-requests 24
"""

import argparse
import asyncio
import copy
import io
import json
import platform
import re
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import yaml
from cpu import cpu_per_request, cpu_seconds
from load import WORKLOADS, closed_loop, run_vllm
from prometheus_client.parser import text_string_to_metric_families

from serve_app.config import model_deployment_name
from serve_app.ops import local_ray
from serve_app.parallel import Parallelism
from serve_app.store.home import apply_cache_environment
from serve_app.store.model_store import SMOLLM2, embedded_model_path, prepare
from tests.e2e.reference import Reference

ROOT = Path(__file__).resolve().parents[1]
PORT = 8313
# A float32 model on a GPU computes attention's dot products in TF32 (10 bits of mantissa):
# its log-probabilities differ from a float32 CPU forward pass by up to a few hundredths.
TOLERANCE = {"cuda": 5e-2, "cpu": 1e-4}
# Over 1,024 positions float32 rounding grows apart between vLLM's and transformers' kernels:
# on the CPU, a few positions of a random prompt differ by up to 2e-3 on the engine's own
# top-k path as on the full vocabulary's. The full vocabulary is compared with the reference
# within this, and with the engine's own scores of the same prompt within the tolerance.
LONG_TOLERANCE = {"cuda": 5e-2, "cpu": 5e-3}
TEXT = ("The committee met on Tuesday to review the budget for the coming year. After a long "
        "discussion, the members agreed that the library would receive more money for new books, "
        "while the sports hall would wait another year for its repairs.")
LABELS = [" Paris", " London", " Rome"]
CACHE_READS = "ray_probserve_prefix_cache_read_tokens_total"  # as Ray's metrics agent exports it
NPY = {"Accept": "application/x-npy"}
INVARIANT = f"{SMOLLM2}-batch-invariant"


class Table:
    """Each check's outcome and figures, in order; failed checks make the run fail."""

    def __init__(self, device: str):
        self.device, self.rows = device, []

    def add(self, check: str, passed: bool, detail: str, seconds: float) -> None:
        self.rows.append((check, "ok" if passed else "FAILED", f"{seconds:.1f}", detail))
        print(f"{'ok    ' if passed else 'FAILED'} {check} ({seconds:.1f} s): {detail}", flush=True)

    def check(self, check: str, action) -> None:
        """`action()` returns its detail; an AssertionError (or any error) is a failed check."""
        started = time.perf_counter()
        try:
            detail, passed = action(), True
        except Exception as error:  # a failed check is reported, the others still run
            detail, passed = f"{type(error).__name__}: {error}"[:300], False
        self.add(check, passed, detail, time.perf_counter() - started)

    def markdown(self) -> str:
        lines = [f"# gpu-smoke on {self.device}", "", "| check | outcome | seconds | detail |",
                 "| --- | --- | --- | --- |"]
        rows = [f"| {check} | {outcome} | {seconds} | {detail.replace('|', '/')} |"
                for check, outcome, seconds, detail in self.rows]
        return "\n".join(lines + rows) + "\n"

    @property
    def passed(self) -> bool:
        return all(outcome == "ok" for _, outcome, _, _ in self.rows)


def device_name(device: str) -> str:
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name(0)
    return f"CPU ({platform.processor() or platform.machine()})"


def environment(device: str) -> str:
    """CUDA, driver, torch, vLLM, and the runner an engine of gpu.yaml's settings would use."""
    import torch
    import vllm

    from serve_app.config import ModelConfig
    from serve_app.engine.vllm_adapter import engine_args, prepare_process
    from serve_app.engine.vllm_fence.replica_start import check_runner

    model = ModelConfig.model_validate(smoke_model(device))
    prepare_process(model)
    config = engine_args(model).create_engine_config()
    check_runner(config)  # refuses Model Runner V2, naming it
    parts = [f"torch {torch.__version__}", f"vLLM {vllm.__version__}", "runner V1 (GPUModelRunner)"]
    if device == "cuda":
        assert torch.cuda.is_available(), "torch sees no CUDA device"
        driver = nvidia_smi("driver_version")
        parts[:0] = [f"CUDA {torch.version.cuda}", f"driver {driver}"]
    return ", ".join(parts)


def nvidia_smi(field: str) -> str:
    return subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, check=True).stdout.splitlines()[0].strip()


def deployment(device: str) -> dict:
    name = "gpu.yaml" if device == "cuda" else "local.yaml"
    return yaml.safe_load((ROOT / "deployments" / name).read_text())["applications"][0]["args"]


def split_layout(gpus: int) -> tuple[int, int]:
    """SmolLM2 across this many GPUs: the most tensor ranks that divide its 9 heads (3 on 3 to 8
    GPUs), else two pipeline stages of its 30 layers (2 GPUs: 9 heads do not split in two)."""
    config = json.loads((embedded_model_path(SMOLLM2) / "config.json").read_text())
    tensor = max(size for size in range(1, gpus + 1) if not Parallelism(size, 1).problems(config))
    return (tensor, 1) if tensor > 1 or gpus < 2 else (1, 2)


def smoke_model(device: str, layout: tuple[int, int] = (1, 1)) -> dict:
    """The deployment's first model's settings, for the embedded SmolLM2, one replica, split
    as `layout` (tensor, pipeline) with a GPU a worker."""
    model = copy.deepcopy(deployment(device)["models"][0])
    model.update(name=SMOLLM2, autoscaling_config={"min_replicas": 1, "max_replicas": 1},
                 tensor_parallel_size=layout[0], pipeline_parallel_size=layout[1])
    model.pop("path", None)
    # A cluster's node groups and pod sizes: on one machine, Ray places by what it has (a
    # replica of three workers would otherwise ask for three times gpu.yaml's 48 GiB).
    for sizing in ("resources", "memory"):
        model.get("ray_actor_options", {}).pop(sizing, None)
    return model


def smoke_args(device: str, layout: tuple[int, int] = (1, 1)) -> dict:
    """The deployment's sections but tenancy and batch storage (keys and shared folders of a
    cluster), serving the smoke's model."""
    args = {key: value for key, value in deployment(device).items() if key not in ("tenancy", "batch")}
    for section in ("ingress", "serializer_pool"):
        args.get(section, {}).get("ray_actor_options", {}).pop("resources", None)
    return {**args, "models": [smoke_model(device, layout)]}


def post(url: str, body: dict, **options) -> httpx.Response:
    response = httpx.post(f"{url}/v1/completions", json={"model": SMOLLM2, **body}, timeout=300, **options)
    assert response.status_code == 200, response.text[:300]
    return response


def close(got, expected, tolerance: float) -> float:
    """The largest difference; fails beyond the tolerance."""
    difference = np.abs(np.asarray(got, np.float64) - np.asarray(expected, np.float64))
    worst = np.unravel_index(np.argmax(difference), difference.shape)
    assert difference[worst] <= tolerance, \
        f"off by {difference[worst]:.2e} at {tuple(map(int, worst))} (tolerance {tolerance:g})"
    return float(difference[worst])


class Checks:
    def __init__(self, url: str, metrics_url: str, reference: Reference, device: str,
                 full_vocab_positions: int = 1024):
        self.url, self.metrics_url, self.reference = url, metrics_url, reference
        self.full_vocab_positions = full_vocab_positions
        self.tolerance, self.long_tolerance = TOLERANCE[device], LONG_TOLERANCE[device]
        self.ids = reference.tokenizer.encode(TEXT)
        self.rows = reference.log_softmax(self.ids)

    def echo_top_5(self) -> str:
        """The echoed prompt's logprobs, and its top 5 by token id (vLLM's prompt_logprobs)."""
        choice = post(self.url, {"prompt": self.ids, "echo": True, "logprobs": 1, "prompt_logprobs": 5,
                                 "max_tokens": 1, "temperature": 0}).json()["choices"][0]
        count = len(self.ids)
        assert choice["logprobs"]["token_ids"][:count] == self.ids, "the echoed tokens are not the prompt"
        scored = np.arange(count - 1)
        worst = close(choice["logprobs"]["token_logprobs"][1:count], self.rows[scored, self.ids[1:]],
                      self.tolerance)
        positions = choice["prompt_logprobs"]
        assert len(positions) == count and positions[0] is None
        for row, top in zip(self.rows[:-1], positions[1:], strict=True):
            ids = [int(token) for token in top]
            worst = max(worst, close([entry["logprob"] for entry in top.values()], row[ids], self.tolerance))
            assert 5 <= len(ids) <= 6, f"{len(ids)} entries for a top 5 and the prompt's token"
        return f"{count - 1} positions, top 5 each, largest difference {worst:.1e}"

    def labels(self) -> str:
        label_ids = [self.reference.tokenizer.encode(label)[0] for label in LABELS]
        prompt = self.reference.tokenizer.encode("The capital of France is")
        body = {"prompt": prompt, "echo": True, "max_tokens": 1, "temperature": 0, "logprobs": 0,
                "logprob_token_ids": label_ids}
        logprobs = post(self.url, body).json()["choices"][0]["logprobs"]
        rows = self.reference.log_softmax(prompt + [logprobs["token_ids"][-1]])
        worst = 0.0
        for position, top in enumerate(logprobs["top_logprobs"][1:]):  # the prompt's, then the generated
            values = [top[self.reference.tokenizer.decode([label])] for label in label_ids]
            worst = max(worst, close(values, rows[position][label_ids], self.tolerance))
        return f"{len(label_ids)} labels at {len(prompt) - 1} prompt positions and the generated one, " \
               f"largest difference {worst:.1e}"

    def span_reads_the_cache(self) -> str:
        # Several KV blocks (128 tokens on a CPU host, 16 on a GPU): the cache is read in whole ones.
        prompt = self.reference.tokenizer.encode("A primed context: " + " ".join([TEXT] * 6))
        start = len(prompt) * 3 // 4
        before = cache_reads(self.metrics_url)
        post(self.url, {"prompt": prompt, "max_tokens": 1})  # primes the prefix cache
        body = {"prompt": prompt, "logprob_start_len": start, "logprobs": 1, "max_tokens": 1}
        logprobs = post(self.url, body).json()["choices"][0]["logprobs"]
        rows = self.reference.log_softmax(prompt)
        worst = close(logprobs["token_logprobs"][: len(prompt) - start],
                      rows[np.arange(start - 1, len(prompt) - 1), prompt[start:]], self.tolerance)
        read = poll_grown(self.metrics_url, before)
        return f"{len(prompt) - start} positions from {start}, {read:.0f} tokens read from prefix caches, " \
               f"largest difference {worst:.1e}"

    def full_vocabulary(self) -> str:
        prompt = [int(t) for t in np.random.default_rng(0).integers(100, 40000, self.full_vocab_positions)]
        started = time.perf_counter()
        body = {"model": SMOLLM2, "prompt": prompt, "max_tokens": 1, "prompt_logprobs": -1}
        before = cpu_seconds()
        with httpx.stream("POST", f"{self.url}/v1/completions", headers=NPY, json=body, timeout=600) as got:
            assert got.status_code == 200, got.read()[:300]
            chunks = got.iter_bytes()
            parts = [next(chunks)]
            first_byte = time.perf_counter() - started
            parts.extend(chunks)
        total = time.perf_counter() - started
        spent = cpu_per_request(before, cpu_seconds(), 1)
        rows = distributions(b"".join(parts), prompt)
        worst = close(rows, self.reference.log_softmax(prompt)[:-1], self.long_tolerance)
        echoed = post(self.url, {"prompt": prompt, "echo": True, "logprobs": 0, "max_tokens": 1}).json()
        own = echoed["choices"][0]["logprobs"]["token_logprobs"][1:len(prompt)]
        agree = close(rows[np.arange(len(rows)), prompt[1:]], own, self.tolerance)
        size = sum(len(part) for part in parts)
        return f"{len(rows)} rows, largest difference {worst:.1e} from the reference, {agree:.1e} from " \
               f"the engine's own scores; first byte {first_byte:.2f} s, all {size / 2**20:.0f} MiB " \
               f"in {total:.2f} s{cpu_by_role(spent)}"

    def concurrent(self, device: str) -> str:
        """32 scoring requests and 2 full-vocabulary ones at once: every answer right."""
        peak = GpuMemoryPeak() if device == "cuda" else None
        scoring = [{"prompt": self.ids[: 8 + i], "echo": True, "logprobs": 1, "max_tokens": 1}
                   for i in range(32)]
        full = {"prompt": self.ids, "max_tokens": 1, "prompt_logprobs": -1}
        with ThreadPoolExecutor(34) as pool:
            scored = pool.map(lambda body: post(self.url, body).json(), scoring)
            distributed = pool.map(lambda body: post(self.url, body, headers=NPY).content, [full, full])
            scored, distributed = list(scored), list(distributed)
        worst = 0.0
        for body, answer in zip(scoring, scored, strict=True):
            ids = body["prompt"]
            worst = max(worst, close(answer["choices"][0]["logprobs"]["token_logprobs"][1:len(ids)],
                                     self.rows[np.arange(len(ids) - 1), ids[1:]], self.tolerance))
        for content in distributed:
            worst = max(worst, close(distributions(content, self.ids), self.rows[:-1], self.tolerance))
        memory = f"; peak GPU memory {peak.stop() / 1024:.1f} GiB" if peak else ""
        return f"34 at once, all 200, largest difference {worst:.1e}{memory}"

    def same_bits(self, model: str) -> str:
        """Each scoring kind alone, then among 32 requests of 8 to 200 tokens at once: every
        number the same bits (JSON's shortest float32 digits, the .npy's bytes)."""
        probes = self.probes(model)
        alone = [answer(self.url, body) for body in probes.values()]
        crowd = [{"model": model, "prompt": (self.ids * 4)[: 8 + 6 * i], "echo": True, "logprobs": 2,
                  "max_tokens": 1 + i % 8, "temperature": 0} for i in range(32)]
        with ThreadPoolExecutor(len(crowd) + len(probes)) as pool:
            others = [pool.submit(post, self.url, body) for body in crowd[:16]]
            probed = [pool.submit(answer, self.url, body) for body in probes.values()]
            others += [pool.submit(post, self.url, body) for body in crowd[16:]]
            together = [future.result() for future in probed]
            for other in others:
                other.result()
        differ = [kind for kind, first, second in zip(probes, alone, together, strict=True)
                  if first != second]
        assert not differ, f"differ under load: {', '.join(differ)}"
        return f"{', '.join(probes)}: bit-identical alone and among 32 others"

    def probes(self, model: str) -> dict[str, dict]:
        """One request of each scoring kind."""
        labels = [self.reference.tokenizer.encode(label)[0] for label in LABELS]
        longer = (self.ids * 3)[:120]
        greedy = {"model": model, "max_tokens": 1, "temperature": 0}
        return {"echo top-8": {**greedy, "prompt": self.ids, "echo": True, "logprobs": 8},
                "prompt_logprobs top-8": {**greedy, "prompt": longer, "prompt_logprobs": 8},
                "labels": {**greedy, "prompt": self.ids, "echo": True, "logprobs": 0,
                           "logprob_token_ids": labels},
                "a span": {**greedy, "prompt": longer, "logprob_start_len": 60, "logprobs": 5},
                "generated top-5": {**greedy, "prompt": self.ids[:20], "max_tokens": 8, "logprobs": 5},
                "full vocabulary": {**greedy, "prompt": self.ids[:64], "prompt_logprobs": -1}}


def answer(url: str, body: dict) -> bytes | list:
    """What must not change with the load: a full vocabulary's .npy bytes, else the choices."""
    if body.get("prompt_logprobs") == -1:
        return post(url, body, headers=NPY).content
    return post(url, body).json()["choices"]


class GpuMemoryPeak:
    """The GPU's used memory, polled every 0.2 s until stopped: the largest reading (MiB)."""

    def __init__(self):
        self.peak, self.done = 0, threading.Event()
        self.thread = threading.Thread(target=self.poll, daemon=True)
        self.thread.start()

    def poll(self) -> None:
        while not self.done.wait(0.2):
            self.peak = max(self.peak, int(nvidia_smi("memory.used")))

    def stop(self) -> int:
        self.done.set()
        self.thread.join()
        return self.peak


def cpu_by_role(spent: dict[str, float]) -> str:
    """CPU seconds of the model replica and vLLM's engine, where this process started them
    (the GPU worker group's CPUs are sized from the replica's: docs/operations.md "Sizing")."""
    model = sum(ms for role, ms in spent.items() if role == model_deployment_name(SMOLLM2)) / 1000
    engine = sum(ms for role, ms in spent.items() if role.startswith("vLLM")) / 1000
    return f"; CPU: the model replica {model:.2f} s, vLLM's engine {engine:.2f} s" if model else ""


def distributions(npy: bytes, prompt: list[int]) -> np.ndarray:
    """The scored rows of a full-vocabulary .npy body, each a distribution (its log-sum-exp
    within 1e-3 of 0), one record per prompt position."""
    records = np.load(io.BytesIO(npy))
    assert records["token_id"].tolist() == prompt, f"{len(records)} records for {len(prompt)} positions"
    rows = records["logprobs"][1:]
    totals = np.abs(np.logaddexp.reduce(rows.astype(np.float64), axis=1))
    assert totals.max() <= 1e-3, f"a row's log-sum-exp is {totals.max():.2e}"
    return rows


def cache_reads(metrics_url: str) -> float:
    text = httpx.get(metrics_url, timeout=30).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == CACHE_READS and sample.labels.get("model") == SMOLLM2)


def poll_grown(metrics_url: str, before: float, limit_s: float = 60) -> float:
    """Cache reads since `before`, once Ray's metrics report them (every few seconds)."""
    deadline = time.monotonic() + limit_s
    while (read := cache_reads(metrics_url) - before) <= 0:
        assert time.monotonic() < deadline, "no prefix-cache read reported"
        time.sleep(0.5)
    return read


def load(table: Table, url: str, requests: int, stop_first: bool, peer: bool) -> dict:
    """A short closed loop at 16 clients, probserve then vLLM's server (bench/load.py): `distinct`
    (a small request of a prompt of its own each) and `echo128` (a sequence of its own each).
    Returns probserve's runs."""
    plan = [("distinct", 16, requests), ("echo128", 16, requests)]
    ours = {(workload, clients): closed_run(url, SMOLLM2, workload, clients, count)
            for workload, clients, count in plan}
    if stop_first:
        local_ray.stop()  # its GPU memory, for vLLM's server
    theirs = run_vllm(plan, None, 300, tuned=True) if peer else {}
    for key, run in ours.items():
        statuses = {*run["statuses"], *theirs.get(key, {}).get("statuses", {})}
        against = f"; vLLM's server {rate(theirs[key])}; {run['req/s'] / theirs[key]['req/s']:.2f}x" \
            if peer else ""
        table.add(f"load: {key[0]}, {key[1]} clients", statuses == {200}, f"probserve {rate(run)}{against}",
                  run["seconds"])
    return ours


def closed_run(url: str, model: str, workload: str, clients: int, requests: int) -> dict:
    return asyncio.run(closed_loop(url, model, WORKLOADS[workload], clients, requests, 300)).report()


def batch_invariant(table: Table, reference: Reference, metrics_url: str, requests: int,
                    default_mode: dict | None) -> None:
    """SmolLM2 again with vLLM's batch-invariant mode, served alone on one GPU: the same bits
    alone and under load, and its throughput against the default mode's run above."""
    model = {**smoke_model("cuda"), "name": INVARIANT, "path": str(embedded_model_path(SMOLLM2)),
             "batch_invariant": True}
    url = local_ray.start({**smoke_args("cuda"), "models": [model]}, port=PORT, log_to_driver=False)
    checks = Checks(url, metrics_url, reference, "cuda")
    table.check("batch-invariant mode: the same bits alone and among 32 others",
                lambda: checks.same_bits(INVARIANT))
    if requests:
        run = closed_run(url, INVARIANT, "distinct", 16, requests)
        cost = f"; {run['req/s'] / default_mode['req/s']:.2f}x the default mode's" if default_mode else ""
        table.add("batch-invariant mode: load: distinct, 16 clients", set(run["statuses"]) == {200},
                  f"probserve {rate(run)}{cost}", run["seconds"])
    local_ray.stop()


def rate(run: dict) -> str:
    return f"{run['req/s']:.1f} req/s, p50 {run['p50']:.3f} s, p99 {run['p99']:.3f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], help="default: cuda where torch sees one")
    parser.add_argument("--url", help="check this running service (serving SmolLM2) instead of starting one")
    parser.add_argument("--metrics-url", default=f"http://127.0.0.1:{local_ray.METRICS_PORT}/metrics")
    parser.add_argument("--load-requests", type=int, default=200, help="per load run (0: none)")
    parser.add_argument("--full-vocab-positions", type=int, default=1024,
                        help="of the full-vocabulary check's prompt")
    parser.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True,
                        help="the load run against vLLM's own server too (it takes a minute to start "
                             "on a CPU)")
    parser.add_argument("--output", type=Path, default=Path("."), help="folder of the table's file")
    parser.add_argument("--gpus", type=int, help="GPUs to split the model across (default: all torch "
                        "sees; 1: unsplit)")
    options = parser.parse_args()
    import torch

    device = options.device or ("cuda" if torch.cuda.is_available() else "cpu")
    apply_cache_environment()
    prepare(SMOLLM2)
    gpus = options.gpus or (torch.cuda.device_count() if device == "cuda" else 1)
    layout = split_layout(gpus)
    table = Table(device_name(device) + (f", {layout[0]} x {layout[1]} workers" if gpus > 1 else ""))
    table.check("environment", lambda: environment(device))
    url = options.url or local_ray.start(smoke_args(device, layout), port=PORT, log_to_driver=False)
    checks = Checks(url, options.metrics_url, Reference(embedded_model_path(SMOLLM2)), device,
                    options.full_vocab_positions)
    table.check("echo with top-5", checks.echo_top_5)
    table.check("labels", checks.labels)
    table.check("a span after a priming request", checks.span_reads_the_cache)
    table.check(f"full vocabulary, {options.full_vocab_positions} positions", checks.full_vocabulary)
    table.check("32 scoring requests with 2 full-vocabulary ones", lambda: checks.concurrent(device))
    if device == "cpu":  # on a GPU, in vLLM's batch-invariant mode only (below)
        table.check("the same bits alone and among 32 others", lambda: checks.same_bits(SMOLLM2))
    runs = {}
    if options.load_requests:
        runs = load(table, url, options.load_requests, stop_first=not options.url, peer=options.peer)
    elif not options.url:
        local_ray.stop()
    if device == "cuda" and not options.url:
        batch_invariant(table, checks.reference, options.metrics_url, options.load_requests,
                        runs.get(("distinct", 16)))
    options.output.mkdir(parents=True, exist_ok=True)
    file = options.output / f"gpu-smoke-{re.sub(r'[^A-Za-z0-9._]+', '-', table.device).strip('-')}.md"
    file.write_text(table.markdown())
    print(f"\n{table.markdown()}\nwritten to {file}")
    raise SystemExit(0 if table.passed else 1)


if __name__ == "__main__":
    main()
