"""vLLM's own OpenAI server, as the benchmarks' baseline."""

import os
import subprocess
import sys

from probserve.store.model_store import SMOLLM2, embedded_model_path


def vllm_server(port: int, kv_cache_gib: int = 2, tuned: bool = True) -> subprocess.Popen:
    """vLLM's OpenAI server on the embedded SmolLM2, float32.

    tuned: with the settings probserve's engine uses (both cores for inference, eager mode);
    otherwise as a new user starts it, with vLLM's defaults (on this 2-core machine it keeps
    one core from inference and compiles the model). VLLM_PLUGINS empty: vLLM as it ships,
    without probserve's plugin from this environment."""
    env = {**os.environ, "VLLM_PLUGINS": "", "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)}
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(embedded_model_path(SMOLLM2)), "--served-model-name", SMOLLM2,
               "--dtype", "float32", "--max-logprobs", "-1", "--max-model-len", "2048",
               "--port", str(port)]
    if tuned:
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
        command.append("--enforce-eager")
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
