"""Builds the Ray Serve application from a configuration: the import path of the Serve config
files (`import_path: serve_app.app:build_app`, with the AppConfig as `args`)."""

from ray.serve import Application

from serve_app.config import AppConfig, model_deployment_name
from serve_app.ingress import Ingress
from serve_app.pool import SerializerPool
from serve_app.replica import ModelReplica


def build_app(args: dict) -> Application:
    config = AppConfig.model_validate(args)
    replicas = {
        model.name: ModelReplica.options(
            name=model_deployment_name(model.name),
            autoscaling_config=model.autoscaling_config,
            ray_actor_options=model.ray_actor_options,
            max_ongoing_requests=model.max_ongoing_requests,
            max_queued_requests=model.max_queued_requests,
            health_check_period_s=model.health_check_period_s,
            health_check_timeout_s=model.health_check_timeout_s,
        ).bind(model, config.serializer_pool.chunk_positions)
        for model in config.models
    }
    pool = config.serializer_pool
    serializers = SerializerPool.options(
        max_ongoing_requests=pool.max_ongoing_requests,
        autoscaling_config=pool.autoscaling_config,
        ray_actor_options=pool.ray_actor_options,
    ).bind(config)
    return Ingress.options(
        max_ongoing_requests=config.ingress.max_ongoing_requests,
        autoscaling_config=config.ingress.autoscaling_config,
        ray_actor_options=config.ingress.ray_actor_options,
    ).bind(config, replicas, serializers)
