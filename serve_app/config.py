"""The application's configuration: what the Serve config files' `args` hold.

Each model's capabilities live here and nowhere else: GET /v1/models reports them and the
ingress enforces them.
"""

from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from ray.serve.config import AutoscalingConfig

from serve_app.models import BUILDERS, embedded_model_path


def checked_autoscaling(value: dict[str, Any]) -> dict[str, Any]:
    """Ray Serve's autoscaling_config, checked here: Serve itself ignores unknown keys."""
    unknown = sorted(set(value) - set(AutoscalingConfig.model_fields))
    if unknown:
        raise ValueError(f"unknown autoscaling_config keys {unknown}")
    AutoscalingConfig(**value)
    return value


Autoscaling = Annotated[dict[str, Any], AfterValidator(checked_autoscaling)]
ONE_REPLICA = {"min_replicas": 1, "max_replicas": 1}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# vLLM's sampler reserves this many label columns per request (MAX_LOGPROB_TOKEN_IDS).
VLLM_MAX_LABEL_IDS = 128


class Capabilities(Strict):
    max_logprobs: int = Field(100, ge=0)
    # Token ids one request may ask `logprob_token_ids` for (label scoring).
    max_logprob_token_ids: int = Field(VLLM_MAX_LABEL_IDS, ge=1, le=VLLM_MAX_LABEL_IDS)
    full_vocab_max_prompt_tokens: int = Field(1024, ge=0)
    max_model_len: int = Field(2048, ge=2)
    # Prompt tokens one request may score (echo, prompt_logprobs, logprob_start_len);
    # defaults to the whole context window.
    max_scored_tokens: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def scored_tokens_within_context(self) -> "Capabilities":
        if self.max_scored_tokens is None:
            object.__setattr__(self, "max_scored_tokens", self.max_model_len)
        return self


class ModelConfig(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
    # A local Hugging Face folder; when absent, the embedded model of this name.
    path: str | None = None
    capabilities: Capabilities = Capabilities()
    dtype: str = "float32"
    enforce_eager: bool = True
    max_num_batched_tokens: int | None = None
    # GiB of KV cache on a CPU host (VLLM_CPU_KVCACHE_SPACE); ignored on GPUs.
    cpu_kv_cache_gib: int = Field(1, ge=1)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    max_ongoing_requests: int = Field(32, ge=1)
    autoscaling_config: Autoscaling = ONE_REPLICA
    ray_actor_options: dict[str, Any] = {"num_cpus": 1}

    @model_validator(mode="after")
    def path_or_embedded(self) -> "ModelConfig":
        if self.path is None and self.name not in BUILDERS:
            raise ValueError(
                f"model {self.name!r} needs a path: embedded models are {sorted(BUILDERS)}"
            )
        return self

    def resolved_path(self) -> Path:
        return Path(self.path).expanduser() if self.path else embedded_model_path(self.name)


class IngressConfig(Strict):
    max_body_bytes: int = Field(16 << 20, ge=1024)
    max_batch_prompts: int = Field(64, ge=1)
    max_n: int = Field(16, ge=1)
    # Full-vocabulary requests one ingress replica holds at once, from the replica call to the
    # last byte (each can hold hundreds of MB of rows); the others wait for a slot.
    max_full_vocab_requests: int = Field(2, ge=1)
    autoscaling_config: Autoscaling = ONE_REPLICA
    ray_actor_options: dict[str, Any] = {"num_cpus": 0.25}


class AppConfig(Strict):
    models: list[ModelConfig] = Field(min_length=1)
    ingress: IngressConfig = IngressConfig()

    @model_validator(mode="after")
    def unique_names(self) -> "AppConfig":
        names = [model.name for model in self.models]
        if len(names) != len(set(names)):
            raise ValueError(f"model names must be unique, got {names}")
        return self

    def model(self, name: str) -> ModelConfig | None:
        return next((model for model in self.models if model.name == name), None)
