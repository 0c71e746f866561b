"""An idle service's CPU: probserve on deployments/local.yaml (or --config) at rest once started,
each of its processes' CPU over a window, by role, in CPU-milliseconds a second; vLLM's own
server at rest after it, the same way (--targets).

    .venv/bin/python bench/idle.py
    .venv/bin/python bench/idle.py --seconds 60 --settle 30 --targets probserve vllm --runs 3
"""

import argparse
import collections
import statistics
import time
from pathlib import Path

import httpx
from cpu import cpu_seconds
from load import PORT, probserve_serving
from servers import vllm_server


def at_rest(seconds: float) -> dict[str, float]:
    """CPU-milliseconds a second of each role among this process's children, over `seconds`."""
    before = cpu_seconds()
    time.sleep(seconds)
    spent = collections.Counter()
    for pid, (role, total) in cpu_seconds().items():
        spent[role] += total - before.get(pid, (role, 0.0))[1]
    return {role: 1000 * cpu / seconds for role, cpu in spent.most_common()}


def probserve_at_rest(config: Path, settle: float, seconds: float) -> dict[str, float]:
    with probserve_serving(config):
        time.sleep(settle)
        return at_rest(seconds)


def vllm_at_rest(settle: float, seconds: float) -> dict[str, float]:
    server = vllm_server(PORT, kv_cache_gib=1)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{PORT}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("vLLM's server did not start")
            time.sleep(1)
        time.sleep(settle)
        return at_rest(seconds)
    finally:
        server.terminate()
        server.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("deployments/local.yaml"))
    parser.add_argument("--targets", nargs="+", choices=["probserve", "vllm"], default=["probserve", "vllm"])
    parser.add_argument("--settle", type=float, default=30, help="seconds at rest before the window")
    parser.add_argument("--seconds", type=float, default=60, help="the window measured")
    parser.add_argument("--runs", type=int, default=1, help="runs of each target, alternated")
    options = parser.parse_args()
    measured = {target: [] for target in options.targets}
    for run in range(options.runs):
        for target in options.targets:
            if target == "probserve":
                spent = probserve_at_rest(options.config, options.settle, options.seconds)
            else:
                spent = vllm_at_rest(options.settle, options.seconds)
            measured[target].append(spent)
            print(f"{target}, run {run + 1}: {sum(spent.values()):.1f} ms/s: "
                  + ", ".join(f"{role} {ms:.1f}" for role, ms in spent.items() if ms >= 0.1), flush=True)
    print("\n| target | CPU at rest, ms a second (median of runs) | the largest roles |\n| --- | --- | --- |")
    for target, runs in measured.items():
        roles = collections.Counter({role: statistics.median(run.get(role, 0.0) for run in runs)
                                     for role in set().union(*runs)})
        largest = ", ".join(f"{role} {ms:.1f}" for role, ms in roles.most_common(6))
        print(f"| {target} | {statistics.median(sum(run.values()) for run in runs):.1f} | {largest} |")


if __name__ == "__main__":
    main()
