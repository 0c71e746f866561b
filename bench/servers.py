"""The benchmarks' peers: vLLM's own OpenAI server, and Ray Serve LLM's OpenAI app (the peer on
probserve's own architecture), on the embedded SmolLM2 with probserve's engine settings."""

import logging
import os
import subprocess
import sys
import time

import httpx

from serve_app.ops import local_ray
from serve_app.store.model_store import SMOLLM2, embedded_model_path

# vLLM as it ships: without probserve's plugin from this environment.
AS_SHIPPED = {"VLLM_PLUGINS": ""}
# What a probserve replica sets too (serve_app.engine.vllm_adapter.prepare_process).
TUNED = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
RAY_SERVE_LLM_APP = "ray-serve-llm"


def vllm_server(port: int, kv_cache_gib: int = 2, tuned: bool = True,
                extra: tuple[str, ...] = ()) -> subprocess.Popen:
    """vLLM's OpenAI server on the embedded SmolLM2, float32.

    tuned: with the settings probserve's engine uses (both cores for inference, eager mode);
    otherwise as a new user starts it, with vLLM's defaults (on this 2-core machine it keeps
    one core from inference and compiles the model). extra: more of its arguments."""
    env = {**os.environ, **AS_SHIPPED, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)}
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(embedded_model_path(SMOLLM2)), "--served-model-name", SMOLLM2,
               "--dtype", "float32", "--max-logprobs", "-1", "--max-model-len", "2048",
               "--port", str(port), *extra]
    if tuned:
        env.update(TUNED)
        command.append("--enforce-eager")
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def ray_serve_llm(port: int, kv_cache_gib: int = 1) -> str:
    """Ray Serve LLM's OpenAI app (`ray.serve.llm.build_openai_app`: Serve's HTTP front, an
    OpenAiIngress replica, an LLMServer replica holding vLLM's AsyncLLM), started in this
    process's own Ray like probserve's, behind the same front; returns its URL once the model
    is listed. Stop it with serve_app.ops.local_ray.stop."""
    from ray import serve
    from ray.serve.llm import LLMConfig, build_openai_app

    # In its replicas' environment only: probserve, started next in this process, needs its
    # plugin.
    environment = {**AS_SHIPPED, **TUNED, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
                   "RAYLLM_MODEL_RESPONSE_BATCH_TIMEOUT_MS": "0",  # no wait to batch chunks
                   # Its model runs in a Ray actor, where Ray sets OpenMP's threads to the
                   # actor's CPUs (1): every core, as vLLM's CPU worker binds them.
                   "OMP_NUM_THREADS": str(os.cpu_count())}
    # probserve's HTTP front (HAProxy unless RAY_SERVE_ENABLE_HA_PROXY=0), whichever ran first.
    os.environ[local_ray.HAPROXY] = local_ray.ray_environment()[local_ray.HAPROXY]
    # Logical CPUs: its ingress and server replicas and the engine's placement group.
    local_ray.start_local_ray(cpus=4, resources={}, log_to_driver=False)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Ray Serve LLM logs at INFO
    config = LLMConfig(
        model_loading_config={"model_id": SMOLLM2, "model_source": str(embedded_model_path(SMOLLM2))},
        engine_kwargs={"dtype": "float32", "max_model_len": 2048, "enforce_eager": True,
                       "max_logprobs": -1},
        placement_group_config={"bundles": [{"CPU": 1}]}, runtime_env={"env_vars": environment},
        deployment_config={"autoscaling_config": {"min_replicas": 1, "max_replicas": 1}})
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(build_openai_app({"llm_configs": [config]}), name=RAY_SERVE_LLM_APP, route_prefix="/")
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while SMOLLM2 not in models_listed(url):
        if time.monotonic() > deadline:
            raise TimeoutError(f"Ray Serve LLM did not list {SMOLLM2} within 300 s")
        time.sleep(0.5)
    return url


def models_listed(url: str) -> list[str]:
    try:
        return [card["id"] for card in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError):
        return []
