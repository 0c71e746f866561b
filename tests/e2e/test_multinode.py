"""Many nodes, on this machine: a head node (ingress, serializer pool, Serve's proxy) and a
worker node standing in for a model's GPU worker group (its custom resource in place of the
GPU node's labels). `probserve serve --address` puts the app on the running cluster; the model
replica lands on the worker node and answers correctly; the worker node is lost at once and
requests get an enveloped 503, never a hang; a new worker node joins and the model answers
again, with nobody redeploying anything."""

import os
import secrets
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from serve_app.ops.local_ray import APP_NAME, ray_environment
from serve_app.store.home import apply_cache_environment
from tests.e2e.conftest import IN_ENGINE_CORE, MODEL, TINY_KV_GIB, free_port
from tests.e2e.ray_cluster import RayNode, node_options
from tests.e2e.waiting import poll_until

CPU_GROUP = {"probserve-cpu": 100}
MODEL_GROUP = {f"probserve-model-{MODEL}": 1}
START_LIMIT_S = 300
# A lost node's requests fail within Ray's wait for the actor's death (its default 60 s).
FAILURE_LIMIT_S = 90
RECOVERY_LIMIT_S = 300
GREEDY = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 4,
          "temperature": 0, "logprobs": 1}


def serve_config(port: int) -> dict:
    """The layout of deployments/production.yaml in small: the model on its group's nodes,
    ingress, pool and batch runner on the CPU group's (here the head), Serve's proxy on the head."""
    on_cpu_group = {"num_cpus": 0.1, "resources": {"probserve-cpu": 1}}
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [{"name": APP_NAME, "route_prefix": "/", "import_path": "serve_app.ops.app:build_app",
                          "args": {
                              "models": [{"name": MODEL, "capabilities": {"max_model_len": 512},
                                          "health_check_period_s": 2, "cpu_kv_cache_gib": TINY_KV_GIB,
                                          **IN_ENGINE_CORE,
                                          "ray_actor_options": {"num_cpus": 0.5, "resources": MODEL_GROUP}}],
                              "ingress": {"ray_actor_options": on_cpu_group},
                              "serializer_pool": {"ray_actor_options": on_cpu_group},
                              "batch": {"ray_actor_options": on_cpu_group}}}],
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A head node; the test adds and loses worker nodes. Everything stops after."""
    home = apply_cache_environment()
    folder = tmp_path_factory.mktemp("multinode")
    # Ray's token authentication, with a token of this cluster's own, for its nodes and for
    # whatever joins it (`probserve serve --address`).
    token = home / "ray-multinode" / "auth_token"
    token.parent.mkdir(exist_ok=True)
    token.write_text(secrets.token_hex(32))
    # HAProxy's statistics and metrics ports, away from those of the session's cluster on this
    # same machine (under KubeRay each node is a pod of its own).
    haproxy_ports = {"RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()),
                     "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port())}
    env = {**os.environ, **ray_environment(), **haproxy_ports, "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN_PATH": str(token)}
    gcs = free_port()
    head = RayNode(folder / "head.log", env, "--head", f"--port={gcs}", "--include-dashboard=false",
                   f"--ray-client-server-port={free_port()}", f"--temp-dir={home / 'ray-multinode'}",
                   *node_options(2, CPU_GROUP, free_port()))
    nodes = [head]

    def add_worker() -> RayNode:
        worker = RayNode(folder / f"worker{len(nodes)}.log", env, f"--address=127.0.0.1:{gcs}",
                         *node_options(1, MODEL_GROUP, free_port()))
        nodes.append(worker)
        return worker
    yield {"address": f"127.0.0.1:{gcs}", "env": env, "head": head, "add_worker": add_worker,
           "folder": folder}
    for node in reversed(nodes):
        node.kill()
    assert not any(node.processes() for node in nodes)


def probserve_serve(cluster: dict, port: int, env: dict) -> subprocess.CompletedProcess:
    """`probserve serve --address`: the app onto the running cluster."""
    config = cluster["folder"] / "serve.yaml"
    config.write_text(yaml.safe_dump(serve_config(port)))
    command = [str(Path(sys.executable).parent / "probserve"), "serve", "--address", cluster["address"],
               "--config", str(config)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=START_LIMIT_S)


def deploy(cluster: dict, port: int) -> str:
    """The app onto the running cluster; returns its URL."""
    done = probserve_serve(cluster, port, cluster["env"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "deployed on the Ray cluster" in done.stdout
    return f"http://127.0.0.1:{port}"


def test_joining_without_the_clusters_token_is_a_clear_error(cluster):
    # Ray tries a cluster it cannot join 20 times, a second apart; twice is enough here.
    env = {**cluster["env"], "RAY_AUTH_TOKEN": "not-the-token", "RAY_NUM_REDIS_GET_RETRIES": "2"}
    done = probserve_serve(cluster, free_port(), env)
    assert done.returncode == 1
    assert f"cannot join the Ray cluster at {cluster['address']}" in done.stderr
    assert "RAY_AUTH_MODE=token" in done.stderr and "Traceback" not in done.stderr


def check_answer(answer: dict, reference) -> None:
    ids = reference.tokenizer.encode(GREEDY["prompt"])
    generated = answer["choices"][0]["logprobs"]["token_ids"]
    assert generated == reference.greedy(ids, GREEDY["max_tokens"])
    rows = reference.log_softmax(ids + generated)[len(ids) - 1:-1]
    np.testing.assert_allclose(answer["choices"][0]["logprobs"]["token_logprobs"],
                               rows[np.arange(len(generated)), generated], atol=1e-4)


def greedy_request(url: str) -> httpx.Response:
    """A completion request; a hang fails the test (httpx's timeout)."""
    return httpx.post(f"{url}/v1/completions", json=GREEDY, timeout=FAILURE_LIMIT_S)


def assert_refused(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "not_ready" and response.headers["retry-after"]


def answered_or_refused(url: str) -> httpx.Response | None:
    """The answer to a request, or None where it was refused with an enveloped 503."""
    response = greedy_request(url)
    if response.status_code == 200:
        return response
    assert_refused(response)
    return None


def refused_and_known_lost(url: str) -> bool:
    """A request is refused with an enveloped 503 (never a hang); whether /health says the
    model has lost its replica."""
    assert_refused(greedy_request(url))
    return httpx.get(f"{url}/health", timeout=30).json()["models"][MODEL] == "no running replica"


def test_the_model_on_a_worker_node_survives_losing_it(cluster, references):
    reference = references[MODEL]
    worker = cluster["add_worker"]()
    url = deploy(cluster, free_port())
    assert worker.runs(f"ServeReplica:{APP_NAME}:Model-{MODEL}")
    assert not cluster["head"].runs(f"ServeReplica:{APP_NAME}:Model-{MODEL}")
    assert cluster["head"].runs(f"ServeReplica:{APP_NAME}:Ingress")
    answer = httpx.post(f"{url}/v1/completions", json=GREEDY, timeout=60)
    assert answer.status_code == 200, answer.text
    check_answer(answer.json(), reference)

    worker.kill()
    # Refused from the first request on, until and after the service knows the node is gone.
    poll_until(lambda: refused_and_known_lost(url), 2 * FAILURE_LIMIT_S, "the lost replica still listed",
               pause_s=0.5)
    assert httpx.get(f"{url}/health", timeout=30).status_code == 503
    assert_refused(greedy_request(url))

    cluster["add_worker"]()
    # While the new replica starts: each request refused, then answered right.
    answer = poll_until(lambda: answered_or_refused(url), RECOVERY_LIMIT_S, "no answer", pause_s=0.5)
    check_answer(answer.json(), reference)
