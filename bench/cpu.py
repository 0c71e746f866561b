"""CPU per request, by the role of each process a benchmark started (Serve's proxy, each
deployment's replicas, vLLM's engine core and worker...), from the processes' CPU times."""

import collections
import re
from pathlib import Path

import psutil


def process_role(command_line: str) -> str:
    """What a server's process is, from its command line (Ray and vLLM name their processes)."""
    if deployment := re.search(r"ServeReplica:[^:\s]+:(\S+)", command_line):
        return re.sub(r"\.[A-Za-z_]\w*$", "", deployment[1])  # Ray adds the running method
    for mark, role in (("ProxyActor", "Serve proxy"), ("HAProxyManager", "HAProxy manager"),
                       ("haproxy", "HAProxy"), ("ServeController", "Serve controller"),
                       ("DashboardAgent", "Ray metrics agent"),
                       ("EngineCore", "vLLM engine core"), ("RayWorkerWrapper", "vLLM worker"),
                       ("VLLM::Worker", "vLLM worker"), ("vllm.entrypoints", "vLLM API server")):
        if mark in command_line:
            return role
    return f"other: {Path(command_line.split(' ', 1)[0]).name}"


def cpu_seconds(own_role: str | None = None) -> dict[int, tuple[str, float]]:
    """Each process this one started (Ray's and the servers', at any depth): its role and CPU
    seconds so far; this process's own too, as `own_role`, when it does work measured (a
    driver's), not when it is only the load."""
    seconds, this = {}, psutil.Process()
    if own_role is not None:
        times = this.cpu_times()
        seconds[this.pid] = (own_role, times.user + times.system)
    for process in this.children(recursive=True):
        try:
            times = process.cpu_times()
            seconds[process.pid] = (process_role(" ".join(process.cmdline())),
                                    times.user + times.system)
        except psutil.Error:
            continue  # gone meanwhile
    return seconds


def cpu_per_request(before: dict, after: dict, answered: int) -> dict[str, float]:
    """Milliseconds of CPU per answered request, by role, between two `cpu_seconds()`."""
    spent = collections.Counter()
    for pid, (role, seconds) in after.items():
        spent[role] += seconds - before.get(pid, (role, 0.0))[1]
    return {role: 1000 * seconds / max(answered, 1) for role, seconds in spent.most_common()}


def spent_line(label: str, spent: dict[str, float], least: float = 0.05) -> str:
    """`spent` (role -> milliseconds) as one line, largest first, with its total."""
    return (f"    {label}: " + ", ".join(f"{role} {ms:.1f}" for role, ms in spent.items() if ms >= least)
            + f"; total {sum(spent.values()):.1f}")
