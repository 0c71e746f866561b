"""The application's configuration: what the Serve config files' `args` hold.

Each model's capabilities live here and nowhere else: GET /v1/models reports them and the
ingress enforces them.
"""

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from ray.serve.config import AutoscalingConfig

from probserve.store.home import probserve_home
from probserve.store.model_store import BUILDERS, embedded_model_path
from probserve.vllm_constants import MAX_LOGPROB_TOKEN_IDS


def checked_autoscaling(value: dict[str, Any]) -> dict[str, Any]:
    """Ray Serve's autoscaling_config, checked here: Serve itself ignores unknown keys."""
    unknown = sorted(set(value) - set(AutoscalingConfig.model_fields))
    if unknown:
        raise ValueError(f"unknown autoscaling_config keys {unknown}")
    AutoscalingConfig(**value)
    return value


Autoscaling = Annotated[dict[str, Any], AfterValidator(checked_autoscaling)]
ONE_REPLICA = {"min_replicas": 1, "max_replicas": 1}


def model_deployment_name(model_name: str) -> str:
    """The Serve deployment of a model's replicas."""
    return f"Model-{model_name}"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


VLLM_MAX_LABEL_IDS = MAX_LOGPROB_TOKEN_IDS  # vLLM's sampler reserves this many label columns
LARGEST_DEFAULT_KV_BLOCK = 128  # vLLM's block_size when unset: 128 on a CPU, 16 on a GPU


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


class ScoredCacheConfig(Strict):
    """Each model replica's scored-prefix cache (probserve.engine.scored_cache)."""

    enabled: bool = True
    max_bytes: int = Field(256 << 20, ge=0)
    # Top-k entries kept per position: requests for up to this many are served from it.
    top_k: int = Field(5, ge=0)


class ModelConfig(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
    # A local Hugging Face folder; when absent, the embedded model of this name.
    path: str | None = None
    capabilities: Capabilities = Capabilities()
    dtype: str = "float32"
    enforce_eager: bool = True
    max_num_batched_tokens: int | None = None
    # GiB of KV cache on a CPU host (vLLM's kv_cache_memory_bytes); ignored on GPUs. vLLM
    # allocates and zeroes all of it at start: a small model needs a fraction of a GiB.
    cpu_kv_cache_gib: float = Field(1, gt=0)
    # Tokens a KV block (vLLM's block_size); None: vLLM's default for the platform, 128 on a
    # CPU and 16 on a GPU. The prefix caches reuse whole blocks only: a smaller block leaves
    # less of a shared context to compute again.
    kv_block_size: int | None = Field(None, gt=0)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    # Requests one replica hands its engine at once: vLLM batches them, so more clients make
    # bigger engine steps up to this many (vLLM's own server: up to its max_num_seqs, 128 on a
    # CPU, 256 to 1,024 on a GPU); beyond it requests wait in the ingress's router. vLLM's
    # scheduler keeps them within the KV cache. Its cost is time: a request let in may wait
    # behind this many in the engine, after up to max_queue_wait_s in the router.
    max_ongoing_requests: int = Field(128, ge=1)
    # Requests waiting for a replica beyond those, per ingress replica; more are refused with
    # 503 `overloaded`.
    max_queued_requests: int = Field(128, ge=0)
    # How long a request may have waited there, for room on a replica, when a replica takes
    # it: beyond, 503 `overloaded` at once, and its place goes to the next. A burst is answered
    # or refused within a bound. A model scaled to zero waits for the replica its request wakes.
    max_queue_wait_s: float = Field(30, gt=0)
    # A request that found every replica full waits in the ingress's router until one of the
    # router's requests ends and frees a place (probserve.front.replica_router), or for this
    # long at most, then asks the replicas their queue lengths: the places that other callers
    # (other ingress replicas, batch and dataset work) free are found that way only, and so
    # is the place of a woken request that a replica refused while it was still finishing the
    # request that ended. Each wait is this long (Serve's own backoff starts at 25 ms and
    # doubles up to 0.5 s): every wait that ends unwoken asks each full replica again.
    router_max_backoff_s: float = Field(0.1, gt=0)
    # Background requests (batch lines, dataset documents) go into a replica's engine only
    # while no online request is in it, this many at a time, and a prompt with rows (echo,
    # prompt_logprobs) `background_window` positions at a time (rounded down to whole KV
    # blocks, at least one): an online request that arrives waits for that much background
    # work at most (probserve.engine.background). Once no online request has been in the
    # engine for `background_quiet_s`, the rest of a background prompt goes in whole, and up
    # to `max_background_in_engine_quiet` of them (None: as many as max_ongoing_requests
    # lets in), at twice the throughput of short windows on a CPU; the first online request
    # after such a pause may wait for their prefills.
    max_background_in_engine: int = Field(4, ge=1)
    background_window: int = Field(512, ge=1)
    background_quiet_s: float = Field(2, ge=0)
    max_background_in_engine_quiet: int | None = Field(None, ge=1)
    # Ray Serve asks each replica for vLLM's engine health this often; a replica that fails
    # (its engine process died) or takes longer than the timeout is replaced.
    health_check_period_s: float = Field(10, gt=0)
    health_check_timeout_s: float = Field(30, gt=0)
    autoscaling_config: Autoscaling = ONE_REPLICA
    ray_actor_options: dict[str, Any] = {"num_cpus": 1}
    scored_cache: ScoredCacheConfig = ScoredCacheConfig()
    # Prompt positions of full-vocabulary rows computed at a time (probserve.engine.windows),
    # rounded down to whole KV blocks (at least one): the first rows leave after one window,
    # and no process holds more than a window of [positions x vocabulary].
    full_vocab_window: int = Field(128, ge=1)
    # The prefix caches (vLLM's KV cache, salted per tenant, and the scored-prefix cache) are
    # each tenant's own unless shared: a shared cache lets one tenant time whether another
    # sent a prompt.
    shared_prefix_caches: bool = False

    def largest_full_vocab_window(self) -> int:
        """The most positions one full-vocabulary window can show: the replica rounds the
        window down to whole KV blocks, at least one (vLLM's default block, 128 at most)."""
        return max(self.full_vocab_window, self.kv_block_size or LARGEST_DEFAULT_KV_BLOCK)

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
    # How long a full-vocabulary request waits for a slot, and how many wait at most, before
    # 503 `overloaded`: a flood of them must not hold the ingress.
    full_vocab_wait_s: float = Field(30, ge=0)
    max_full_vocab_waiting: int = Field(16, ge=0)
    # Retry-After (seconds) on a 503 `overloaded`.
    retry_after_s: int = Field(1, ge=0)
    # How long /health waits for a model's health check before it calls the model not ready.
    readiness_timeout_s: float = Field(5, gt=0)
    # Requests one ingress replica works on at once. It only parses, tokenizes and awaits
    # replicas, so it takes hundreds; Ray Serve's default (5) made the proxy queue the rest.
    max_ongoing_requests: int = Field(512, ge=1)
    # The token-probability viewer at /ui (probserve.front.viewer): off, /ui answers 404.
    ui: bool = True
    autoscaling_config: Autoscaling = ONE_REPLICA
    ray_actor_options: dict[str, Any] = {"num_cpus": 0.25}


class SerializerPoolConfig(Strict):
    """The CPU workers that write full-vocabulary JSON (probserve.fullvocab.pool)."""

    # Positions per chunk of rows the model replica puts in Ray's object store (16 SmolLM2
    # positions are 3 MB of float32): a pool worker's unit of `.npy`.
    chunk_positions: int = Field(16, ge=1)
    # The plain JSON a pool worker writes in one call, in whole positions (at least one): a
    # SmolLM2 position is about 3.4 MB of JSON, a 128k vocabulary's 9 MB. What the ingress
    # holds per call in flight. gzip is written a chunk a call: the ingress holds a quarter of
    # its JSON, and smaller calls cost more than they save (docs/benchmarks.md).
    json_piece_bytes: int = Field(8 << 20, ge=1)
    # Calls of one response in the pool or written and not yet sent: several workers serve
    # one response at once, and a slow client holds production back.
    window: int = Field(4, ge=1)
    # Calls one worker takes at once. It writes one at a time, so that a worker is a core's
    # worth of work and the pool scales by workers; the next waits in the worker and starts
    # the moment the first ends (a call waiting in the ingress's router for a free worker is
    # retried after 25 ms, doubling to 0.5 s, which left workers idle between pieces).
    max_ongoing_requests: int = Field(2, ge=1)
    # The workers' nice value: where they share cores with the engines, the ingress and the
    # proxy, those go first, so that writing a full-vocabulary body does not hold the small
    # requests back; idle cores are the workers' all the same. 0: as every other process.
    niceness: int = Field(10, ge=0, le=19)
    autoscaling_config: Autoscaling = ONE_REPLICA
    ray_actor_options: dict[str, Any] = {"num_cpus": 0.5}


class BatchConfig(Strict):
    """OpenAI's Files and Batch APIs (probserve.batch, docs/operations.md "Batches")."""

    # The folder of uploaded files, batch records and their results; every ingress replica and
    # the batch runner must see the same one (a shared volume on a cluster). None:
    # PROBSERVE_HOME/batch.
    storage: str | None = None
    # The largest upload and the most requests in one batch (OpenAI's own bounds).
    max_file_bytes: int = Field(200 << 20, ge=1024)
    max_lines: int = Field(50_000, ge=1)
    # Lines the runner sends at once, over all its batches: more keep a model busier, and take
    # more of the tenants' in-flight places; fewer leave more of each model replica's
    # max_ongoing_requests to online requests.
    lines_in_flight: int = Field(8, ge=1)
    # vLLM's scheduling priority of batch lines and dataset documents, lower first: above 0,
    # online requests (0) go first and background work takes what they leave (each model's
    # max_background_in_engine); 0 makes batch work compete with online requests as equals.
    priority: int = Field(1, ge=0)
    ray_actor_options: dict[str, Any] = {"num_cpus": 0.1}

    def root(self) -> Path:
        return Path(self.storage) if self.storage else probserve_home() / "batch"


class TenancyConfig(Strict):
    """API keys and per-tenant limits (probserve.tenants.keyring, docs/tenancy.md)."""

    # The tenants and their keys' hashes (`probserve keys create` writes it); without it every
    # request is served without a key.
    key_file: str | None = None
    # The server secret the key hashes are keyed with (at least 32 bytes), kept apart from the
    # key file.
    secret_file: str | None = None
    # A production configuration says so: it is refused without a key file.
    require_keys: bool = False
    # How often the key file is checked for changes (keys added or revoked without a restart).
    reload_s: float = Field(5, gt=0)
    # Where request and token rates (and usage) are counted: memory:// holds for one ingress
    # replica, redis://host:port/db across all of them.
    storage: str = Field("memory://", pattern=r"^(memory://|redis://\S+)$")
    # When that storage cannot be reached: "open" serves uncounted, "closed" answers 503
    # `rate_limit_unavailable`. Either way it is logged.
    on_storage_failure: Literal["open", "closed"] = "closed"

    @model_validator(mode="after")
    def keys_where_required(self) -> "TenancyConfig":
        if self.require_keys and not self.key_file:
            raise ValueError("tenancy.require_keys is set: name the tenancy.key_file")
        if bool(self.key_file) != bool(self.secret_file):
            raise ValueError("tenancy.key_file and tenancy.secret_file go together")
        return self


class AppConfig(Strict):
    models: list[ModelConfig] = Field(min_length=1)
    ingress: IngressConfig = IngressConfig()
    serializer_pool: SerializerPoolConfig = SerializerPoolConfig()
    tenancy: TenancyConfig = TenancyConfig()
    batch: BatchConfig = BatchConfig()

    @model_validator(mode="after")
    def unique_names(self) -> "AppConfig":
        names = [model.name for model in self.models]
        if len(names) != len(set(names)):
            raise ValueError(f"model names must be unique, got {names}")
        return self

    @model_validator(mode="after")
    def ingress_holds_what_it_may_be_sent(self) -> "AppConfig":
        """Beyond its max_ongoing_requests, an ingress replica's requests wait in Ray Serve's
        proxy, unbounded and unanswered: the bounds behind it must be full first, so that the
        ingress answers 503 `overloaded` itself."""
        held = self.ingress.max_full_vocab_requests + self.ingress.max_full_vocab_waiting + sum(
            model.max_ongoing_requests * model.autoscaling_config.get("max_replicas", 1)
            + model.max_queued_requests for model in self.models)
        if self.ingress.max_ongoing_requests < held:
            raise ValueError(
                f"ingress.max_ongoing_requests ({self.ingress.max_ongoing_requests}) must be at "
                f"least {held}: the requests the models take and queue (max_ongoing_requests x "
                "max_replicas + max_queued_requests, each) and the full-vocabulary slots and "
                "waiters")
        return self

    def placements(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """Each deployment's ray_actor_options and autoscaling_config: what Ray places where."""
        return [(self.ingress.ray_actor_options, self.ingress.autoscaling_config),
                (self.serializer_pool.ray_actor_options, self.serializer_pool.autoscaling_config),
                (self.batch.ray_actor_options, ONE_REPLICA),
                *((m.ray_actor_options, m.autoscaling_config) for m in self.models)]

    def model(self, name: str) -> ModelConfig | None:
        return next((model for model in self.models if model.name == name), None)
