"""`probserve serve` stops leaving nothing behind, however a supervisor or a person stops it:
SIGTERM to the command alone (as Kubernetes sends it to a container's first process), SIGTERM
to its process group, Ctrl-C (SIGINT to the group, as a terminal sends it). Every process it
started (Ray's, vLLM's engines, HAProxy) has ended within the grace period the docs state and
its ports are free. A start after a stop cut short (SIGKILL to every process but HAProxy) ends
the HAProxy the last one left, and one whose port another process holds says which.

Each service is a `probserve serve` of its own, on a Ray cluster of its own, beside the
session's, with the viewer switched off (`ingress.ui: false`): /ui answers 404 naming the
setting while the API serves."""

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from serve_app.ops.processes import HAPROXY_PORTS, alive
from serve_app.ops.supervisor import STOP_S
from serve_app.store.model_store import TINY
from tests.e2e.conftest import TINY_KV_GIB, free_port
from tests.e2e.waiting import read_until

pytestmark = pytest.mark.e2e

START_S = 300
PROBSERVE = str(Path(sys.executable).with_name("probserve"))
# The command's exit, once its processes have ended, takes a moment more than STOP_S bounds.
EXIT_S = 5


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    # Scaled to zero: no engine starts, so that two services start at once within the suite's
    # load (with engines they took over 300 s there); the stop is the same for vLLM's processes,
    # which the replica starts (the serve command stopped with an engine: docs/operations.md).
    model = {"name": TINY, "cpu_kv_cache_gib": TINY_KV_GIB, "capabilities": {"max_model_len": 256},
             "ray_actor_options": {"num_cpus": 0.5},
             "autoscaling_config": {"min_replicas": 0, "max_replicas": 1}}
    document = {"http_options": {"host": "127.0.0.1"}, "applications": [{
        "name": "probserve", "route_prefix": "/", "import_path": "serve_app.ops.app:build_app",
        "args": {"models": [model], "ingress": {"ui": False},
                 "batch": {"storage": str(tmp_path_factory.mktemp("stop-batch"))}}}]}
    path = tmp_path_factory.mktemp("stop") / "serve.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


class Service:
    """`probserve serve` in a process group of its own, as a supervisor or a shell starts it;
    what it prints goes to a file (a pipe nobody reads would fill and stop it)."""

    def __init__(self, config: Path, folder: Path):
        self.port, self.metrics_port = free_port(), free_port()
        # HAProxy's own ports too: the session's service holds the default ones.
        self.haproxy_ports = {variable: free_port() for variable in HAPROXY_PORTS}
        self.log = folder / f"serve-{self.port}.log"
        environment = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # not the session's
        environment.update({variable: str(port) for variable, port in self.haproxy_ports.items()})
        command = [PROBSERVE, "serve", "--config", str(config),
                   "--port", str(self.port), "--metrics-port", str(self.metrics_port)]
        with self.log.open("w") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment,
                                            start_new_session=True)

    def output(self) -> list[str]:
        return self.log.read_text().splitlines()

    def what_went_wrong(self) -> str:
        """The lines that name an error (a traceback's last line), then the last ones."""
        lines = self.output()
        errors = [line for line in lines if re.match(r"\S*(Error|Exception)\b", line.strip())]
        return "\n".join(["errors:", *errors[-10:], "last lines:", *lines[-20:]])

    def serving(self) -> "Service":
        """Once it says it serves: every process of its tree, HAProxy among them."""
        deadline = time.monotonic() + START_S
        while not any(line.startswith("probserve is serving at") for line in self.output()):
            assert time.monotonic() < deadline and self.process.poll() is None, self.what_went_wrong()
            time.sleep(0.5)
        self.tree = psutil.Process(self.process.pid).children(recursive=True)
        assert any(p.name() == "haproxy" for p in self.tree), [p.name() for p in self.tree]
        return self

    def kill_all_but_haproxy(self) -> psutil.Process:
        """Kills every process of the service but its HAProxy, as a stop cut short leaves it;
        returns that HAProxy. Serve reloads HAProxy as replicas come up: a predecessor still
        draining ends by itself, so the HAProxy left is the one that outlives it."""
        self.tree = psutil.Process(self.process.pid).children(recursive=True)
        for process in [psutil.Process(self.process.pid), *self.tree]:
            with contextlib.suppress(psutil.NoSuchProcess):
                if process.name() != "haproxy":
                    process.kill()
        (haproxy,) = read_until(lambda: [p for p in self.tree if p.name() == "haproxy" and alive(p)],
                                lambda left: len(left) == 1, 30, "one HAProxy left")
        return haproxy

    def signal_alone(self, signal_number: int) -> None:
        self.process.send_signal(signal_number)

    def signal_group(self, signal_number: int) -> None:
        os.killpg(self.process.pid, signal_number)

    def left(self) -> list[str]:
        return [f"{p.pid} {p.name()}" for p in self.tree if alive(p)]

    def assert_nothing_left(self, stop: str) -> None:
        """The command ended within the stated period, with every process it started, and
        freed every port it took."""
        assert self.process.wait(STOP_S + EXIT_S) == 0, (stop, self.output()[-20:])
        assert "probserve stopped" in self.output(), (stop, self.output()[-20:])
        assert not self.left(), f"{stop}: left behind {self.left()}"
        for port in (self.port, self.metrics_port, *self.haproxy_ports.values()):
            assert port_is_free(port), (stop, port)


def assert_the_viewer_is_off(service: Service) -> None:
    for path in ("/ui", "/ui/", "/ui/viewer.js"):
        response = httpx.get(f"http://127.0.0.1:{service.port}{path}", follow_redirects=False)
        assert (response.status_code, response.json()["error"]["code"]) == (404, "not_found"), path
        assert "ingress.ui: false" in response.json()["error"]["message"]
    models = httpx.get(f"http://127.0.0.1:{service.port}/v1/models")
    assert [card["id"] for card in models.json()["data"]] == [TINY]


def port_is_free(port: int) -> bool:
    """Free for a server to listen on: bound as servers bind (HAProxy, uvicorn), with
    SO_REUSEADDR, so that the stopped service's connections still in TIME_WAIT do not count,
    and a socket that still listens does."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def launch(config, tmp_path):
    """Starts services; any a failed test leaves running are killed, their leftovers ended."""
    launched = []

    def start() -> Service:
        launched.append(Service(config, tmp_path))
        return launched[-1]
    yield start
    for service in launched:
        if service.process.poll() is None:
            service.signal_group(signal.SIGKILL)
        for process in getattr(service, "tree", []):  # its tree, known once it served
            if alive(process):
                process.kill()


def test_every_way_of_stopping_ends_every_process_the_service_started(launch):
    """Two services at a time, each on a Ray cluster of its own (four engine starts one after
    another would double the time): one stopped by SIGTERM to the command alone while the
    other is cut short, every process of it killed but its HAProxy, as nothing then ends an
    HAProxy (the raylet's SIGKILL left one listening in most stops); then a start that ends
    that HAProxy, stopped by Ctrl-C, beside one stopped by SIGTERM to its group."""
    alone, cut_short = launch(), launch()
    alone.serving(), cut_short.serving()
    assert_the_viewer_is_off(alone)
    alone.signal_alone(signal.SIGTERM)
    haproxy = cut_short.kill_all_but_haproxy()
    alone.assert_nothing_left("SIGTERM to the command alone")
    assert alive(haproxy) and not port_is_free(cut_short.port)  # what the next start must clear
    restarted, group = launch(), launch()
    restarted.serving(), group.serving()
    ended = f"ended an HAProxy (pid {haproxy.pid}) left by a probserve that did not stop"
    assert ended in restarted.output() + group.output()  # whichever started first ended it
    assert not cut_short.left(), f"cut short, then a start: left behind {cut_short.left()}"
    restarted.signal_group(signal.SIGINT)  # Ctrl-C in the terminal it runs in
    group.signal_group(signal.SIGTERM)
    restarted.assert_nothing_left("Ctrl-C")
    group.assert_nothing_left("SIGTERM to its process group")


def test_a_port_held_by_another_process_is_named_at_start(config):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        refused = subprocess.run([PROBSERVE, "serve", "--config", str(config), "--port", str(port)],
                                 capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1
    assert f"port {port} (HTTP) is in use by pid {os.getpid()} (" in refused.stderr
