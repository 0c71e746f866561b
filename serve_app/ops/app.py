"""Builds the Ray Serve application from a configuration: the import path of the Serve config
files (`import_path: serve_app.ops.app:build_app`, with the AppConfig as `args`)."""

from ray.serve import Application, Deployment
from ray.serve.config import RequestRouterConfig

from serve_app.adapters import check_adapter
from serve_app.batch.runner import BatchRunner
from serve_app.config import AppConfig, ModelConfig, model_deployment_name
from serve_app.engine.replica import ModelReplica
from serve_app.engine.windows import stream_items_ahead
from serve_app.front.ingress import Ingress
from serve_app.front.replica_router import BoundedStreamRouter
from serve_app.fullvocab.pool import SerializerPool


def replica_placement(model: ModelConfig) -> dict:
    """A replica's actor options, and the placement group of its workers if it has several."""
    group = model.placement()
    return group.serve_options() if group else {"ray_actor_options": model.ray_actor_options}


def check_model_folders(config: AppConfig) -> None:
    """Each split model's layout and each configured adapter against the model's config.json,
    where their folders are on this node (on a cluster whose head has no models, each replica
    checks its layout before its engine starts, and vLLM an adapter when it loads it)."""
    for model in config.models:
        folder = model.resolved_path()
        if folder.is_dir():
            model.parallelism().check_model_folder(model.name, folder)
            check_adapters(model)


def check_adapters(model: ModelConfig) -> None:
    for adapter in model.lora.adapters if model.lora else []:
        if adapter.resolved_path().is_dir():
            check_adapter(adapter.resolved_path(), adapter.name, model)


def build_app(args: dict, replica: Deployment | None = None) -> Application:
    """The ingress bound to one model replica deployment per model and the serializer pool;
    `replica`: a subclass of ModelReplica to deploy in its place."""
    config = AppConfig.model_validate(args)
    check_model_folders(config)
    replica = replica or ModelReplica
    replicas = {
        model.name: replica.options(
            name=model_deployment_name(model.name),
            autoscaling_config=model.autoscaling_config,
            **replica_placement(model),
            max_ongoing_requests=model.max_ongoing_requests,
            max_queued_requests=model.max_queued_requests,
            health_check_period_s=model.health_check_period_s,
            health_check_timeout_s=model.health_check_timeout_s,
            request_router_config=RequestRouterConfig(
                initial_backoff_s=model.router_max_backoff_s, max_backoff_s=model.router_max_backoff_s,
                request_router_class=BoundedStreamRouter,
                request_router_kwargs={
                    "stream_items_ahead": stream_items_ahead(model.largest_full_vocab_window(),
                                                             config.serializer_pool.chunk_positions),
                    "prefix_routing": model.prefix_routing.model_dump(),
                    "prefix_block_tokens": model.prefix_block_tokens(),
                    "shared_prefix_caches": model.shared_prefix_caches}),
        ).bind(model, config.serializer_pool.chunk_positions)
        for model in config.models
    }
    pool = config.serializer_pool
    serializers = SerializerPool.options(
        max_ongoing_requests=pool.max_ongoing_requests,
        autoscaling_config=pool.autoscaling_config,
        ray_actor_options=pool.ray_actor_options,
    ).bind(config)
    runner = BatchRunner.options(ray_actor_options=config.batch.ray_actor_options).bind(config)
    return Ingress.options(
        max_ongoing_requests=config.ingress.max_ongoing_requests,
        autoscaling_config=config.ingress.autoscaling_config,
        ray_actor_options=config.ingress.ray_actor_options,
    ).bind(config, replicas, serializers, runner)
