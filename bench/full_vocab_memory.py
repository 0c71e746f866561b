"""Where a full-vocabulary response's memory sits: each process of a running service, grouped
by its part (ingress, serializer pool, model replica, vLLM's engine, ...), sampled every 0.1 s
while one `prompt_logprobs: -1` request is read as fast as this client can; its peak growth
and what it keeps after. A process's memory is its private (anonymous) pages: the pages of
Ray's object store it maps are shared, counted once in the machine's memory in use and shown
apart (the store's file in /dev/shm: its pages stay once written, and are written again).

    .venv/bin/probserve serve --config deployments/local.yaml &
    .venv/bin/python bench/full_vocab_memory.py --tokens 1024 --forms json json gzip npy
"""

import argparse
import collections
import threading
import time

import httpx
import psutil

PARTS = ("Ingress", "SerializerPool", "Model-", "BatchRunner", "ServeController", "ProxyActor",
         "haproxy", "raylet", "gcs_server", "VLLM")
FORMS = {"json": {"accept-encoding": "identity"}, "gzip": {"accept-encoding": "gzip"},
         "npy": {"accept": "application/x-npy"}}


def part_of(process: psutil.Process) -> str | None:
    try:
        command = " ".join(process.cmdline())
    except psutil.Error:
        return None
    return next((part for part in PARTS if part in command), None)


def private_memory(pid: int) -> int:
    """RssAnon: what the process alone holds, without the shared pages it maps."""
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("RssAnon:"))
    return int(line.split()[1]) * 1024


def memory_by_part() -> collections.Counter:
    held = collections.Counter()
    for process in psutil.process_iter():
        part = part_of(process)
        if part:
            try:
                held[part] += private_memory(process.pid)
            except (psutil.Error, OSError, StopIteration):
                pass
    memory = psutil.virtual_memory()
    held["machine"] = memory.total - memory.available
    held["object store"] = psutil.disk_usage("/dev/shm").used  # Ray's plasma file's pages
    return held


def measured(url: str, model: str, tokens: int, form: str) -> None:
    before, peak, done = memory_by_part(), collections.Counter(), threading.Event()

    def sample() -> None:
        while not done.is_set():
            for part, held in memory_by_part().items():
                peak[part] = max(peak[part], held - before[part])
            time.sleep(0.1)
    sampler = threading.Thread(target=sample)
    sampler.start()
    body = {"model": model, "prompt": list(range(1000, 1000 + tokens)), "max_tokens": 1,
            "prompt_logprobs": -1}
    started, size = time.monotonic(), 0
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=FORMS[form], timeout=600) as answer:
        for chunk in answer.iter_raw():
            size += len(chunk)
    total = time.monotonic() - started
    time.sleep(2)
    done.set()
    sampler.join()
    after = memory_by_part()
    print(f"{form}: {size / 1e9:.2f} GB in {total:.1f} s")
    shown = ["machine", "object store"]
    for part in shown + sorted(set(peak) - set(shown), key=lambda p: -peak[p])[:4]:
        kept = (after[part] - before[part]) / 2**20
        print(f"  {part:15s} peak growth {peak[part] / 2**20:6.0f} MiB, kept {kept:6.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--forms", nargs="+", choices=sorted(FORMS), default=["json", "gzip", "npy"])
    options = parser.parse_args()
    for form in options.forms:
        measured(options.url, options.model, options.tokens, form)


if __name__ == "__main__":
    main()
