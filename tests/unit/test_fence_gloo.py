"""Item 12: a process's gloo groups share one device, one polling thread, and compute as before;
the constructions it subclasses, as the installed torch and vLLM write them."""

import ast
import inspect
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch.distributed.distributed_c10d as c10d
import vllm.distributed.utils

ROOT = Path(__file__).resolve().parents[2]
# Each process joins a group of all ranks, then makes a dozen more (vLLM's count for one worker),
# sums its rank over each, and says what the sums came to and how many polling threads it has.
GROUPS = textwrap.dedent("""
    import os, sys
    import torch, torch.distributed as dist
    if sys.argv[1] == "shared":
        from serve_app.engine.vllm_fence.gloo import one_gloo_device_per_process
        one_gloo_device_per_process()
    rank, size, port = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    sums = []
    for group in [dist.new_group(list(range(size)), backend="gloo") for _ in range(12)]:
        total = torch.tensor([rank + 1.0])
        dist.all_reduce(total, group=group)
        sums.append(total.item())
    threads = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    print(sums, threads.count("gloo_tcp_loop"))
    dist.destroy_process_group()
""")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_ranks(mode: str, size: int, **environment) -> list[str]:
    port = str(free_port())
    ranks = [subprocess.Popen([sys.executable, "-c", GROUPS, mode, str(rank), str(size), port], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True, env={**environment, "PATH": "/usr/bin:/bin"})
             for rank in range(size)]
    return [rank.communicate(timeout=120)[0].strip() for rank in ranks]


@pytest.mark.parametrize("size", [1, 2])
def test_a_process_s_groups_share_one_polling_thread_and_sum_as_before(size):
    total = float(sum(range(1, size + 1)))
    assert run_ranks("shared", size) == [f"{[total] * 12} 1"] * size
    assert run_ranks("torch's own", size) == [f"{[total] * 12} 13"] * size  # without it


def test_the_interfaces_named_for_gloo_are_the_shared_devices():
    assert run_ranks("shared", 2, GLOO_SOCKET_IFNAME="lo") == [f"{[3.0] * 12} 1"] * 2
    assert run_ranks("shared", 1, GLOO_SOCKET_IFNAME="no-such-interface") == [""]  # torch's refusal


def gloo_constructions(module) -> list[ast.Call]:
    tree = ast.parse(inspect.getsource(module))
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "ProcessGroupGloo"]


@pytest.mark.parametrize("module", [c10d, vllm.distributed.utils], ids=["torch", "vllm"])
def test_torch_and_vllm_construct_a_gloo_group_as_the_subclass_takes_it(module):
    constructions = gloo_constructions(module)
    assert constructions
    for call in constructions:
        assert len(call.args) == 3 and [k.arg for k in call.keywords] == ["timeout"], ast.unparse(call)


def test_the_options_the_subclass_sets_are_torchs():
    options = c10d.ProcessGroupGloo._Options()
    assert options._threads == 2 and options._devices == [] and options._timeout.total_seconds() == 1800
