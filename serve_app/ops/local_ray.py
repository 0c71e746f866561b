"""Runs the application on this machine: a local Ray cluster, Serve's HTTP proxy, the app."""

import math
import os
import signal
import time
from collections import defaultdict

import httpx

from serve_app.config import AppConfig
from serve_app.store.home import apply_cache_environment, keep_ray_token_at_home
from serve_app.store.model_store import BUILDERS, prepare

APP_NAME = "probserve"
METRICS_PORT = 8080  # Ray's metrics export port on each node, as under KubeRay
# What Ray's processes read from their environment when Ray starts on a node (the images set
# the same: docker/). Serve's HTTP front loads its extra middlewares from the callback
# (serve_app.observe.request_log). HAProxy stands in for Serve's Python proxy and each ingress
# replica serves HTTP itself: 1.6x the small requests per second
# (docs/benchmarks.md#shipped-settings-measured).
PROXY_CALLBACK = {"RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH":
                  "serve_app.observe.request_log:proxy_middlewares"}
HAPROXY = "RAY_SERVE_ENABLE_HA_PROXY"
# A stopping ingress replica stays reachable this long before it refuses connections, which
# HAProxy then retries on another replica. Ray's 30 s is for a load balancer outside Ray that
# targets the replicas (an ALB); here only Ray's own HAProxy does, and it is told at once.
DRAINING_PERIOD = "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"
# The controller restarts a node's HTTP front after three failed checks in a row: every 2 s
# instead of 10, a dead HAProxy is replaced in about 10 s instead of 30 (docs/operations.md).
PROXY_CHECK_PERIOD = "RAY_SERVE_PROXY_HEALTH_CHECK_PERIOD_S"
# Each replica runs its code on the loop that serves its HTTP and calls, instead of a thread
# of its own that hands each response message over through an unbounded queue: a streamed
# body is then written only as fast as the client reads it (HTTP flow control reaches the
# generator), where before the ingress held whatever the client had not read yet.
SAME_LOOP = "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"
# The raylet deletes the objects whose last reference went in batches, every 100 ms instead
# of every second: a full-vocabulary body passes 200 MB/s of rows and pieces through the object
# store, and a second's worth waited there, dead, and grew the store's pages (which it keeps)
# by 190 MiB (docs/benchmarks.md#shipped-settings-measured).
FREE_PERIOD = "RAY_free_objects_period_milliseconds"
# What an idle service polls: Serve's controller runs its loop every 0.5 s instead of 0.1 s
# (each pass asks the GCS for the nodes), and each replica and each handle (the ingress holds
# one per deployment) hands Serve's request counters to Ray's metrics every second instead of
# every 100 ms; Ray exports them every 10 s anyway (docs/benchmarks.md#an-idle-service).
CONTROL_LOOP = "RAY_SERVE_CONTROL_LOOP_INTERVAL_S"
SERVE_METRICS_PERIOD = "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS"
DEFAULTS = {HAPROXY: "1", DRAINING_PERIOD: "5", PROXY_CHECK_PERIOD: "2", SAME_LOOP: "0", FREE_PERIOD: "100",
            CONTROL_LOOP: "0.5", SERVE_METRICS_PERIOD: "1000"}


def ray_environment() -> dict[str, str]:
    """The nodes' environment: the callback, HAProxy, its replicas' draining period, its
    health checks and user code on the replicas' own loop, each unless this environment sets
    it (RAY_SERVE_ENABLE_HA_PROXY=0 keeps Serve's Python proxy)."""
    return {**PROXY_CALLBACK, **{key: os.environ.get(key, value) for key, value in DEFAULTS.items()}}


def logical_resources(config: AppConfig) -> tuple[int, dict[str, int]]:
    """Ray schedules by declared resources: this one node declares what the deployments ask
    for at their largest, CPUs (at least the cores) and custom resources (the node groups of a
    cluster, deployments/production.yaml).

    vLLM's engine processes are not Ray actors, so the real cores are shared anyway."""
    wanted: dict[str, float] = defaultdict(float)
    for options, autoscaling in config.placements():
        replicas = autoscaling.get("max_replicas", 1)
        wanted["CPU"] += options.get("num_cpus", 1) * replicas
        for name, amount in options.get("resources", {}).items():
            wanted[name] += amount * replicas
    cpus = max(os.cpu_count() or 1, math.ceil(wanted.pop("CPU")) + 1)
    return cpus, {name: math.ceil(amount) for name, amount in wanted.items()}


def prepare_embedded_models(config: AppConfig) -> None:
    for model in config.models:
        if model.path is None and model.name in BUILDERS:
            prepare(model.name)


def start(args: dict, host: str = "127.0.0.1", port: int = 8000, log_to_driver: bool = True,
          metrics_port: int = METRICS_PORT, address: str | None = None,
          proxy_location: str = "EveryNode", replica=None) -> str:
    """Starts Ray (or joins the cluster at `address`), Serve and the app; returns the base URL
    once /health answers.

    Without log_to_driver, the replicas' logs stay in Ray's session folder under
    PROBSERVE_HOME/ray instead of this process's output. Prometheus scrapes every process's
    metrics from Ray's metrics agent at `metrics_port` (grafana/prometheus.yml). A cluster
    joined at `address` has its own metrics port, and its nodes their own models and
    environment (ray_environment): only the application is put on it. `replica`: the model
    replicas' deployment, if not probserve's own (serve_app.ops.app)."""
    import ray
    from ray import serve

    from serve_app.ops.app import build_app

    config = AppConfig.model_validate(args)
    if address is None:
        apply_cache_environment()
        prepare_embedded_models(config)
        os.environ.update(ray_environment())  # Ray's processes inherit it from this one
        cpus, resources = logical_resources(config)
        start_local_ray(cpus, resources, log_to_driver, metrics_port)
    else:
        ray.init(address=address, configure_logging=False, log_to_driver=log_to_driver)
    serve.start(proxy_location=proxy_location, http_options={"host": host, "port": port})
    serve.run(build_app(args, replica), name=APP_NAME, route_prefix="/")
    url = f"http://{proxy_host(host, address)}:{port}"
    wait_healthy(url)
    return url


def start_local_ray(cpus: int, resources: dict[str, int], log_to_driver: bool = True,
                    metrics_port: int = METRICS_PORT) -> None:
    """Ray on this machine, its session folders and token under PROBSERVE_HOME."""
    import ray

    home = apply_cache_environment()
    keep_ray_token_at_home(home)
    # ray.init installs a SIGTERM handler in this process that ends it at once: the caller's
    # (probserve serve's stop, which ends every process of the tree) is put back.
    caller_s = signal.getsignal(signal.SIGTERM)
    ray.init(num_cpus=cpus, resources=resources, include_dashboard=False,
             _temp_dir=str(home / "ray"), configure_logging=False, log_to_driver=log_to_driver,
             _metrics_export_port=metrics_port)
    if caller_s is not None:  # None: not a handler of Python's, so none to put back
        signal.signal(signal.SIGTERM, caller_s)


def proxy_host(host: str, address: str | None) -> str:
    """Where this machine reaches Serve's proxy: the cluster's head, or this node."""
    if address and address not in ("auto", "local"):
        return address.removeprefix("ray://").rsplit(":", 1)[0]
    return "127.0.0.1" if host == "0.0.0.0" else host


def wait_healthy(url: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=30).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url}/health did not answer 200 within {timeout_s} s")
        time.sleep(0.5)


def stop() -> None:
    import ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()
