"""A Ray cluster of several nodes on this machine: each node a `ray start --block` process
tree, so that a test can lose one node at once, as when a Kubernetes node goes away."""

import json
import subprocess
import sys
from pathlib import Path

import psutil

RAY = str(Path(sys.executable).parent / "ray")


class RayNode:
    def __init__(self, log: Path, env: dict[str, str], *options: str):
        self.log = log.open("ab")
        self.process = subprocess.Popen([RAY, "start", "--block", "--disable-usage-stats", *options],
                                        env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    def processes(self) -> list[psutil.Process]:
        """The node's processes: raylet, agents, workers and what they started (vLLM's engine)."""
        try:
            root = psutil.Process(self.process.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def runs(self, title: str) -> bool:
        """Whether one of its processes has `title` in its command line (Ray names actors' processes)."""
        def command_line(process: psutil.Process) -> str:
            try:
                return " ".join(process.cmdline())
            except psutil.Error:
                return ""
        return any(title in command_line(process) for process in self.processes())

    def kill(self) -> None:
        """Every process of the node at once (SIGKILL): nothing of it says goodbye."""
        for process in self.processes():
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        self.process.wait(30)
        self.log.close()


def node_options(num_cpus: float, resources: dict[str, float], agent_port: int) -> list[str]:
    return [f"--num-cpus={num_cpus}", f"--resources={json.dumps(resources)}",
            # Each node's agent needs its own port on a shared machine; the object store is
            # kept small, as these nodes only pass small results.
            f"--dashboard-agent-listen-port={agent_port}", "--object-store-memory=100000000"]
