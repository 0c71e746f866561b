"""Autoscaling shown: the session's SentencePiece model scales as deployments/autoscaling.yaml
scales its model (tests/e2e/conftest.py); load raises its replicas from 1 to 2, the end of the
load lowers them again, and no request fails during either transition."""

import threading
import time

import httpx
from ray import serve

from serve_app.ops.app import model_deployment_name
from serve_app.ops.local_ray import APP_NAME
from tests.e2e.conftest import AUTOSCALING, AUTOSCALING_MODEL

LIMIT_S = 240


def running_replicas() -> int:
    deployment = serve.status().applications[APP_NAME].deployments[model_deployment_name(AUTOSCALING_MODEL)]
    return deployment.replica_states.get("RUNNING", 0)


def wait_until(condition, started: float) -> float:
    while not condition():
        assert time.monotonic() - started < LIMIT_S
        time.sleep(0.5)
    return time.monotonic() - started


def test_the_demo_file_scales_between_one_and_two():
    scaling = AUTOSCALING["autoscaling_config"]
    assert (scaling["min_replicas"], scaling["max_replicas"], scaling["target_ongoing_requests"]) == (1, 2, 2)


def test_load_scales_the_model_up_and_its_end_down(base_url, capsys):
    body = {"model": AUTOSCALING_MODEL, "prompt": "The capital of France is", "max_tokens": 32,
            "temperature": 0}
    statuses, stop = [], threading.Event()

    def client(pause_s: float) -> None:
        with httpx.Client(base_url=base_url, timeout=120) as http:
            while not stop.is_set():
                statuses.append(http.post("/v1/completions", json=body).status_code)
                time.sleep(pause_s)

    assert running_replicas() == 1
    started = time.monotonic()
    # Four in flight is twice the target of 2 per replica; more would only slow the second
    # replica's start on these 2 cores.
    clients = [threading.Thread(target=client, args=(0,)) for _ in range(4)]
    for thread in clients:
        thread.start()
    up = wait_until(lambda: running_replicas() == 2, started)
    time.sleep(5)  # load on both replicas
    stop.set()
    for thread in clients:
        thread.join()
    stop.clear()
    trickle = threading.Thread(target=client, args=(1.0,))  # light traffic through the downscale
    trickle.start()
    ended = time.monotonic() - started
    down = wait_until(lambda: running_replicas() == 1, started)
    stop.set()
    trickle.join()
    assert statuses and set(statuses) == {200}, statuses
    with capsys.disabled():
        print(f"\nautoscaling: load from 0 s, 2 replicas at {up:.1f} s, load ended at "
              f"{ended:.1f} s, 1 replica at {down:.1f} s; {len(statuses)} requests, all 200")
