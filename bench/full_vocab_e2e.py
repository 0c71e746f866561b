"""prompt_logprobs: -1 end to end: probserve against vLLM's own OpenAI server, same session.

Both serve the embedded SmolLM2-135M-Instruct (vocabulary 49,152) in float32, one after the
other on this machine. Each request is timed to its first and last byte, in each form (JSON,
JSON with gzip, the binary `.npy`), with the serializer pool at each size asked and each
full-vocabulary window (positions computed at a time: one as long as the prompt is one pass);
the machine's memory in use is sampled during and after it (the whole service: Ray's processes, vLLM's, the
object store).

    .venv/bin/python bench/full_vocab_e2e.py --tokens 128 512 1024 --workers 1 2 \\
        --vllm-tokens 128 --windows 128
"""

import argparse
import statistics
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import yaml
from servers import vllm_server

from serve_app.ops import local_ray
from serve_app.store.home import apply_cache_environment
from serve_app.store.model_store import SMOLLM2, prepare

PORT = 8311
FORMS = {"json": {"accept-encoding": "identity"}, "gzip": {"accept-encoding": "gzip"},
         "npy": {"accept": "application/x-npy"}}


@dataclass
class Timing:
    first_byte: float
    total: float
    size: int
    peak_growth: int = 0  # bytes of memory in use above the idle footprint, at most
    after_growth: int = 0  # the same, a second after the response


def memory_in_use() -> int:
    memory = psutil.virtual_memory()
    return memory.total - memory.available


@contextmanager
def peak_memory():
    """Samples the machine's memory in use every 20 ms; yields a list that ends up holding
    the peak."""
    peak, done = [memory_in_use()], threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], memory_in_use())
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join()


def timed_request(url: str, tokens: int, headers: dict) -> Timing:
    body = {"model": SMOLLM2, "prompt": list(range(100, 100 + tokens)), "max_tokens": 1,
            "prompt_logprobs": -1}
    idle = memory_in_use()
    with peak_memory() as peak, httpx.Client(timeout=900) as client:
        started = time.perf_counter()
        first_byte, size = None, 0
        with client.stream("POST", f"{url}/v1/completions", json=body, headers=headers) as response:
            assert response.status_code == 200, response.status_code
            for chunk in response.iter_raw():
                first_byte = first_byte or time.perf_counter() - started
                size += len(chunk)
        total = time.perf_counter() - started
    time.sleep(1)
    return Timing(first_byte, total, size, peak[0] - idle, memory_in_use() - idle)


def measure(url: str, sizes: list[int], repeats: int, label: str, forms=tuple(FORMS)) -> dict:
    timed_request(url, 8, FORMS["gzip"])  # warm-up
    results = {}
    for tokens in sizes:
        for form in forms:
            headers = FORMS[form]
            runs = [timed_request(url, tokens, headers) for _ in range(repeats)]
            best = min(runs, key=lambda run: run.total)
            results[tokens, form] = timing = Timing(
                statistics.median(r.first_byte for r in runs), statistics.median(r.total for r in runs),
                best.size, max(r.peak_growth for r in runs), max(r.after_growth for r in runs))
            print(f"| {label} | {tokens} | {form} | {timing.first_byte:.2f} s | {timing.total:.2f} s "
                  f"| {timing.size / 1e6:.0f} MB | {timing.peak_growth / 2**20:.0f} MiB "
                  f"| {timing.after_growth / 2**20:.0f} MiB |", flush=True)
    return results


def run_vllm(sizes: list[int], repeats: int) -> dict:
    server = vllm_server(PORT)
    try:
        local_ray.wait_healthy(f"http://127.0.0.1:{PORT}")
        # vLLM has no binary form
        return measure(f"http://127.0.0.1:{PORT}", sizes, repeats, "vLLM server", ("json", "gzip"))
    finally:
        server.terminate()
        server.wait()


def run_probserve(sizes: list[int], repeats: int, workers: int, window: int, block: int | None) -> dict:
    pool = {"autoscaling_config": {"min_replicas": workers, "max_replicas": workers}}
    model = {"name": SMOLLM2, "full_vocab_window": window, "kv_block_size": block}
    url = local_ray.start({"models": [model], "serializer_pool": pool}, port=PORT, log_to_driver=False)
    try:
        return measure(url, sizes, repeats, f"probserve, {workers} pool worker(s), window {window}")
    finally:
        local_ray.stop()


def resident_by_process() -> dict[str, int]:
    """Resident memory of the service's processes, by name (Ray's and vLLM's process titles),
    plus Ray's object store (shared memory, in /dev/shm)."""
    resident: dict[str, int] = {}
    for process in psutil.process_iter(["cmdline", "memory_info"]):
        title = " ".join(process.info["cmdline"] or [])
        if title.startswith(("ray::", "VLLM")):
            name = title.split(" ")[0]
            resident[name] = resident.get(name, 0) + process.info["memory_info"].rss
    resident["object store (/dev/shm)"] = psutil.disk_usage("/dev/shm").used
    return resident


def after_start(config_file: str, tokens: int, count: int) -> None:
    """The first `count` gzip requests after the service starts as `make serve` starts it
    (the config file's app), with the memory in use after each above the level before the
    first."""
    args = yaml.safe_load(Path(config_file).read_text())["applications"][0]["args"]
    url = local_ray.start(args, port=PORT, log_to_driver=False)
    try:
        time.sleep(5)  # what the start left running settles
        started, processes = memory_in_use(), resident_by_process()
        print("| request after start | first byte | total | memory in use after, above the start "
              "| largest growths (resident) |\n| --- | --- | --- | --- | --- |")
        for index in range(1, count + 1):
            timing = timed_request(url, tokens, FORMS["gzip"])
            now = resident_by_process()
            growth = sorted(((now[name] - processes.get(name, 0), name) for name in now), reverse=True)
            largest = ", ".join(f"{name} {grown / 2**20:+.0f} MiB" for grown, name in growth[:3])
            print(f"| {index} | {timing.first_byte:.2f} s | {timing.total:.2f} s "
                  f"| {(memory_in_use() - started) / 2**20:+.0f} MiB | {largest} |", flush=True)
    finally:
        local_ray.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[128, 512, 1024])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--vllm-tokens", type=int, nargs="*", default=[128],
                        help="sizes vLLM's server is asked (it ran out of memory at 512)")
    parser.add_argument("--windows", type=int, nargs="+", default=[128],
                        help="full_vocab_window values (a value of at least the prompt: one pass)")
    parser.add_argument("--kv-block-size", type=int,
                        help="models[].kv_block_size (vLLM's default: 128 on a CPU)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--after-start", metavar="CONFIG",
                        help="instead: three requests of the first --tokens size right after the "
                             "config file's service starts")
    options = parser.parse_args()
    apply_cache_environment()
    prepare(SMOLLM2)
    if options.after_start:
        after_start(options.after_start, options.tokens[0], 3)
        return
    print("| server | prompt tokens | form | first byte | total | bytes | peak memory growth "
          "| after |\n| --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    baseline = run_vllm(options.vllm_tokens, options.repeats) if options.vllm_tokens else {}
    ours = {(workers, window): run_probserve(options.tokens, options.repeats, workers, window,
                                                      options.kv_block_size)
            for workers in options.workers for window in options.windows}
    for (tokens, form), theirs in baseline.items():
        for (workers, window), results in ours.items():
            if (tokens, form) in results:
                print(f"{tokens} tokens, {form}, {workers} worker(s), window {window}: "
                      f"{theirs.total / results[tokens, form].total:.1f}x vLLM's server")
    if len(ours) > 1:
        first, *others = sorted(ours)
        for setup in others:
            for key, timing in ours[setup].items():
                print(f"{key[0]} tokens, {key[1]}: {setup} (workers, window) "
                      f"{ours[first][key].total / timing.total:.2f}x {first}")


if __name__ == "__main__":
    main()
