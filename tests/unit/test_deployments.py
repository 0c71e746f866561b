"""Each Serve config in deployments/ builds an application whose deployments have the
autoscaling, resources and bounds the file says (not only a file that parses)."""

from pathlib import Path

import pytest

from serve_app.config import AppConfig, model_deployment_name
from serve_app.ops.app import build_app
from serve_app.ops.cli import serve_config
from serve_app.ops.local_ray import (
    CONTROL_LOOP,
    DEFAULTS,
    DRAINING_PERIOD,
    FREE_PERIOD,
    HAPROXY,
    PROXY_CALLBACK,
    PROXY_CHECK_PERIOD,
    SAME_LOOP,
    SERVE_METRICS_PERIOD,
    logical_resources,
    ray_environment,
)

FILES = sorted(Path(__file__).resolve().parents[2].glob("deployments/*.yaml"))


def deployments(args: dict) -> dict:
    """The application's deployments by name: the ingress, its models, the pool, the batch
    runner."""
    ingress = build_app(args)._bound_deployment
    _, models, pool, runner = ingress.init_args
    bound = [ingress, pool._bound_deployment, runner._bound_deployment,
             *(app._bound_deployment for app in models.values())]
    return {deployment.name: deployment for deployment in bound}


def assert_deployed_as(deployment, autoscaling: dict, ray_actor_options: dict, max_ongoing: int) -> None:
    built = deployment._deployment_config.autoscaling_config
    for key, value in autoscaling.items():
        assert getattr(built, key) == value, (deployment.name, key)
    assert deployment.ray_actor_options == ray_actor_options
    assert deployment.max_ongoing_requests == max_ongoing


@pytest.mark.parametrize("path", FILES, ids=[path.name for path in FILES])
def test_the_file_builds_what_it_says(path):
    args, _, _ = serve_config(path)
    config = AppConfig.model_validate(args)
    built = deployments(args)
    models = {model_deployment_name(model.name) for model in config.models}
    assert set(built) == {"Ingress", "SerializerPool", "BatchRunner", *models}
    assert built["BatchRunner"].ray_actor_options == config.batch.ray_actor_options
    assert_deployed_as(built["Ingress"], config.ingress.autoscaling_config, config.ingress.ray_actor_options,
                       config.ingress.max_ongoing_requests)
    pool = config.serializer_pool
    assert_deployed_as(built["SerializerPool"], pool.autoscaling_config, pool.ray_actor_options,
                       pool.max_ongoing_requests)
    for model in config.models:
        deployment, group = built[model_deployment_name(model.name)], model.placement()
        actor_options = group.actor_options if group else model.ray_actor_options
        assert_deployed_as(deployment, model.autoscaling_config, actor_options, model.max_ongoing_requests)
        assert deployment._replica_config.placement_group_bundles == (group.bundles if group else None)
        assert deployment.max_queued_requests == model.max_queued_requests
        router = deployment._deployment_config.request_router_config
        # A wait in the router is as long each time: the end of a request wakes it sooner.
        assert router.initial_backoff_s == router.max_backoff_s == model.router_max_backoff_s


def test_production_places_models_on_their_groups_and_the_rest_on_cpu_nodes():
    args, http, _ = serve_config(Path(FILES[0]).parent / "production.yaml")
    built = deployments(args)
    assert http["host"] == "0.0.0.0"
    for name in ("Ingress", "SerializerPool", "BatchRunner"):
        assert built[name].ray_actor_options["resources"] == {"probserve-cpu": 1}
    config = AppConfig.model_validate(args)
    assert len(config.models) >= 2
    for model in config.models:
        options = built[model_deployment_name(model.name)].ray_actor_options
        # Its GPUs (all its workers' under the multiprocess executor, none under Ray's, whose
        # workers hold them) and its group's resource, as many as the workers on its node.
        held = model.workers_per_node() if model.executor_backend() != "ray" else 1
        assert options.get("num_gpus", 0) == (0 if model.executor_backend() == "ray" else held)
        assert options["resources"] == {f"probserve-model-{model.name}": held}


def test_one_machine_declares_the_node_groups_a_file_asks_for():
    args, _, _ = serve_config(Path(FILES[0]).parent / "production.yaml")
    cpus, resources = logical_resources(AppConfig.model_validate(args))
    # ingress 1 x 8, pool 1 x 16, batch runner 0.5, models 4 x (4 + 2 + 2), 70B 8 workers x 4 x
    # 2 replicas, 405B 16 workers x 4: every deployment at its largest
    assert cpus == 8 + 16 + 1 + 32 + 64 + 64 + 1
    assert resources == {"probserve-cpu": 25, "probserve-model-llama-3.1-8b": 4,
                         "probserve-model-qwen2.5-7b-instruct": 2, "probserve-model-mistral-7b-instruct": 2,
                         "probserve-model-llama-3.1-70b-instruct": 16,
                         "probserve-model-llama-3.1-405b-instruct": 16}


def test_nodes_start_with_haproxy_unless_the_environment_keeps_the_python_proxy(monkeypatch):
    for key in DEFAULTS:
        monkeypatch.delenv(key, raising=False)
    assert ray_environment() == {**PROXY_CALLBACK, HAPROXY: "1", DRAINING_PERIOD: "5",
                                 PROXY_CHECK_PERIOD: "2", SAME_LOOP: "0", FREE_PERIOD: "100",
                                 CONTROL_LOOP: "0.5", SERVE_METRICS_PERIOD: "1000"}
    chosen = {HAPROXY: "0", DRAINING_PERIOD: "30", PROXY_CHECK_PERIOD: "10", SAME_LOOP: "1",
              FREE_PERIOD: "1000", CONTROL_LOOP: "0.1", SERVE_METRICS_PERIOD: "100"}
    for key, value in chosen.items():
        monkeypatch.setenv(key, value)
    assert ray_environment() == {**PROXY_CALLBACK, **chosen}
