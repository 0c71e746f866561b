"""The application's configuration: what the Serve config files' `args` hold.

Each model's capabilities live here and nowhere else: GET /v1/models reports them and the
ingress enforces them.
"""

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from ray.serve.config import AutoscalingConfig

from serve_app.batch_invariance import WHERE
from serve_app.parallel import Parallelism, Placement, check_backend, executor_backend, placement, uses_gpus
from serve_app.store.adapter_store import TARGET_MODULES, adapter_path
from serve_app.store.home import adapters_dir, probserve_home
from serve_app.store.model_store import ADAPTERS, BUILDERS, embedded_model_path
from serve_app.vllm_constants import LORA_RANKS, MAX_LOGPROB_TOKEN_IDS


def checked_autoscaling(value: dict[str, Any]) -> dict[str, Any]:
    """Ray Serve's autoscaling_config, checked here: Serve itself ignores unknown keys."""
    unknown = sorted(set(value) - set(AutoscalingConfig.model_fields))
    if unknown:
        raise ValueError(f"unknown autoscaling_config keys {unknown}")
    AutoscalingConfig(**value)
    return value


Autoscaling = Annotated[dict[str, Any], AfterValidator(checked_autoscaling)]
ONE_REPLICA = {"min_replicas": 1, "max_replicas": 1}


def autoscaling_of(deployment: str) -> Any:
    """A deployment's `autoscaling_config` key: one replica unless configured."""
    return Field(ONE_REPLICA, description=f"Ray Serve's autoscaling of {deployment} "
                 "(`min_replicas`, `max_replicas`, `target_ongoing_requests`, ...), checked at load")


def actor_options_of(deployment: str, num_cpus: float) -> Any:
    """A deployment's `ray_actor_options` key."""
    return Field({"num_cpus": num_cpus}, description=f"Ray's actor options of {deployment}: "
                 "CPUs, GPUs, memory, custom resources (a node group)")


def model_deployment_name(model_name: str) -> str:
    """The Serve deployment of a model's replicas."""
    return f"Model-{model_name}"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


VLLM_MAX_LABEL_IDS = MAX_LOGPROB_TOKEN_IDS  # vLLM's sampler reserves this many label columns
LARGEST_DEFAULT_KV_BLOCK = 128  # vLLM's block_size when unset: 128 on a CPU, 16 on a GPU
SMALLEST_DEFAULT_KV_BLOCK = 16


class Capabilities(Strict):
    """What GET /v1/models reports for a model and what the ingress enforces (docs/api.md)."""

    max_logprobs: int = Field(100, ge=0, description="the largest top-k of `logprobs`, "
                              "`top_logprobs` and `prompt_logprobs`")
    max_logprob_token_ids: int = Field(
        VLLM_MAX_LABEL_IDS, ge=1, le=VLLM_MAX_LABEL_IDS,
        description="token ids one request may ask `logprob_token_ids` for (label scoring)")
    full_vocab_max_prompt_tokens: int = Field(1024, ge=0, description="the longest prompt "
                                              "`prompt_logprobs: -1` scores; 0 refuses it")
    max_model_len: int = Field(2048, ge=2, description="the context window the model is served with")
    max_scored_tokens: int | None = Field(
        None, ge=1, description="prompt tokens one request may score (echo, prompt_logprobs, "
        "logprob_start_len); none: the whole context window")

    @model_validator(mode="after")
    def scored_tokens_within_context(self) -> "Capabilities":
        if self.max_scored_tokens is None:
            object.__setattr__(self, "max_scored_tokens", self.max_model_len)
        return self


class ScoredCacheConfig(Strict):
    """Each model replica's scored-prefix cache (serve_app.engine.scored_cache)."""

    enabled: bool = Field(True, description="each model replica keeps the rows it scored, "
                          "to serve a later prompt that shares their prefix")
    max_bytes: int = Field(256 << 20, ge=0, description="the cache's size in bytes, per replica")
    top_k: int = Field(5, ge=0, description="top-k entries kept per position: requests for up "
                       "to this many are served from it")


class PrefixRoutingConfig(Strict):
    """How the models' router keeps a prefix on the replica that holds it
    (serve_app.front.prefix_affinity)."""

    enabled: bool = Field(True, description="requests go to the replica their ingress replica "
                          "sent their longest prefix to, while it has room and is within the "
                          "bound; off: Serve's two random choices")
    load_factor: float = Field(1.5, ge=1, description="the bound: a replica takes a request by "
                               "its prefix while it then holds at most this many times the mean "
                               "of its model's requests in flight, and load_slack more")
    load_slack: int = Field(4, ge=0, description="requests in flight a replica may hold beyond "
                            "load_factor times the mean and still take a request by its prefix")
    index_blocks: int = Field(65_536, ge=1, description="prefix blocks each ingress replica "
                              "remembers it sent to each model replica (the least recent go first)")


SERVED_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:-]*$"
LoraRank = Literal[LORA_RANKS]


class AdapterConfig(Strict):
    """A LoRA adapter of a model, served as a model of its own (docs/api.md "LoRA adapters")."""

    name: str = Field(pattern=SERVED_NAME, description="the id clients send as `model`")
    path: str | None = Field(None, description="its folder (PEFT's adapter_config.json and "
                             "adapter_model.safetensors), which every replica's node sees; "
                             "none: the store's test adapter of this name")

    @model_validator(mode="after")
    def path_or_built(self) -> "AdapterConfig":
        if self.path is None and self.name not in ADAPTERS:
            raise ValueError(f"adapter {self.name!r} needs a path: the store's test adapters are "
                             f"{sorted(ADAPTERS)}")
        return self

    def resolved_path(self) -> Path:
        return Path(self.path).expanduser() if self.path else adapter_path(self.name)


class LoraConfig(Strict):
    """LoRA adapters on a model: vLLM's enable_lora with these bounds."""

    max_lora_rank: LoraRank = Field(16, description="the largest rank an adapter may have "
                                    "(vLLM's choices: 1, 8, 16, 32, ... 512)")
    max_loras: int = Field(4, ge=1, description="adapters one engine step computes")
    max_cpu_loras: int | None = Field(
        None, ge=1, description="adapters a replica holds loaded, the least recently used "
        "dropped first (at least max_loras); none: max_loras")
    target_modules: list[str] = Field(
        TARGET_MODULES, min_length=1, description="the modules adapters may change (vLLM's "
        "names, as in PEFT's adapter_config.json): by default a Llama-style model's attention "
        "and MLP projections. Never lm_head: vLLM computes prompt rows' logits through a LoRA "
        "lm_head with one adapter per request, and an engine step holding two requests' prompt "
        "rows stops the engine")
    adapters: list[AdapterConfig] = Field([], description="adapters every tenant that may "
                                           "use the model may use")

    @model_validator(mode="after")
    def leaves_the_logits_alone(self) -> "LoraConfig":
        if {"lm_head", "logits_processor"} & set(self.target_modules):
            raise ValueError("lora.target_modules: probserve serves no LoRA on lm_head (vLLM "
                             "stops when two requests' prompt rows go through one)")
        return self

    def held(self) -> int:
        """Adapters a replica holds loaded."""
        return self.max_cpu_loras or self.max_loras

    @model_validator(mode="after")
    def holds_a_step(self) -> "LoraConfig":
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"lora.max_cpu_loras ({self.max_cpu_loras}) must be at least "
                             f"lora.max_loras ({self.max_loras})")
        return self


class ModelConfig(Strict):
    """One model: its engine, its replicas' deployment and its bounds (docs/operations.md)."""

    name: str = Field(pattern=SERVED_NAME,
                      description="the id clients send as `model`; an embedded model's name "
                      "needs no `path`")
    path: str | None = Field(None, description="a local Hugging Face folder (config, tokenizer, "
                             "safetensors); none: the embedded model of this name")
    capabilities: Capabilities = Capabilities()
    dtype: str = Field("float32", description="the weights' and activations' type: float32 "
                       "keeps the numbers exact")
    enforce_eager: bool = Field(True, description="vLLM without CUDA graphs or torch.compile: "
                                "the fence's worker patches are verified on eager runs")
    max_num_batched_tokens: int | None = Field(
        None, description="tokens one engine step computes (vLLM's); on a GPU it bounds the "
        "prompt-logprob logits vLLM's memory profiling does not count; none: vLLM's default")
    cpu_kv_cache_gib: float = Field(
        1, gt=0, description="GiB of KV cache on a CPU host, fractions allowed (vLLM's "
        "kv_cache_memory_bytes, allocated and zeroed at start); ignored on a GPU")
    kv_block_size: int | None = Field(
        None, gt=0, description="tokens a KV block holds (vLLM's block_size; on a CPU a "
        "multiple of 32): the prefix caches reuse whole blocks; none: vLLM's, 128 on a CPU "
        "and 16 on a GPU")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="on a GPU, the share "
                                          "of its memory vLLM takes")
    max_ongoing_requests: int = Field(
        128, ge=1, description="requests one replica holds at once, in its engine or waiting "
        "for it; how many are in the engine adapts up to this many (vLLM's server batches up to "
        "its max_num_seqs, 128 on a CPU, 256 to 1,024 on a GPU), within the KV cache; beyond "
        "it requests wait in the ingress's router")
    max_queued_requests: int = Field(128, ge=0, description="requests waiting for a replica "
                                     "beyond those, per ingress replica; more get 503 `overloaded`")
    max_queue_wait_s: float = Field(
        30, gt=0, description="how long one of them may have waited when a replica takes it; "
        "beyond, 503 `overloaded` at once and its place goes to the next, so a burst is "
        "answered or refused within a bound (a model scaled to zero waits for its replica)")
    max_answer_s: float | None = Field(
        30, gt=0, description="an online request the replica expects not to answer within this "
        "many seconds (the work ahead of it at the rate its engine is measured at, and its own) "
        "is refused at once, 503 `overloaded` with a Retry-After of when it would be; one the "
        "engine takes longer for alone may wait half of it; none: no bound "
        "(serve_app.engine.time_admission)")
    router_max_backoff_s: float = Field(
        0.1, gt=0, description="a request that found every replica full is woken when a "
        "request of its ingress replica ends; this is the longest it waits before it asks the "
        "replicas again, which finds places other callers free (serve_app.front.replica_router)")
    max_background_in_engine: int = Field(
        4, ge=1, description="background requests (batch lines, dataset documents) one "
        "replica's engine holds at once, only while no online request is in it "
        "(serve_app.engine.background)")
    background_window: int = Field(
        512, ge=1, description="prompt positions of a background request computed at a time, "
        "in whole KV blocks (at least one): what an arriving online request may wait for")
    background_quiet_s: float = Field(
        2, ge=0, description="after this long with no online request in the engine, the rest "
        "of a background prompt goes in whole (twice the throughput of windows on a CPU)")
    max_background_in_engine_quiet: int | None = Field(
        None, ge=1, description="background requests the engine holds at once after such a "
        "pause; none: as many as max_ongoing_requests lets in")
    health_check_period_s: float = Field(10, gt=0, description="how often Ray Serve asks a "
                                         "replica for its engine's health")
    health_check_timeout_s: float = Field(30, gt=0, description="a replica that fails its "
                                          "health check, or takes longer than this, is replaced")
    tensor_parallel_size: int = Field(
        1, ge=1, description="engine workers each layer is split across (vLLM's): the model's "
        "attention heads divide by it, checked at load; on a GPU, one device each")
    pipeline_parallel_size: int = Field(
        1, ge=1, description="stages the layers are split into (vLLM's), each of "
        "tensor_parallel_size workers; its layers divide by it, checked at load")
    distributed_executor_backend: Literal["mp", "ray", "uni"] | None = Field(
        None, description="how vLLM runs a replica's several workers: `mp`, processes of the "
        "replica on its node, or `ray`, Ray actors in the replica's placement group, across "
        "nodes (GPUs only); none: `ray` for pipeline stages on GPUs, else `mp`. One worker: "
        "`uni` computes in vLLM's engine-core process, one process fewer (on CPUs, a start "
        "14 s shorter) but on the replica's own CPUs only (Ray's OMP_NUM_THREADS): small models")
    autoscaling_config: Autoscaling = autoscaling_of("the model's replicas")
    ray_actor_options: dict[str, Any] = actor_options_of(
        "each replica, or of each engine worker when there are several (the replica reserves "
        "them all in a placement group)", num_cpus=1)
    scored_cache: ScoredCacheConfig = ScoredCacheConfig()
    prefix_routing: PrefixRoutingConfig = PrefixRoutingConfig()
    full_vocab_window: int = Field(
        128, ge=1, description="prompt positions of full-vocabulary rows computed at a time, "
        "in whole KV blocks (at least one): no process holds more than a window of "
        "positions x vocabulary (serve_app.engine.windows)")
    lora: LoraConfig | None = Field(None, description="LoRA adapters served on this model; "
                                    "none: no adapters (vLLM without enable_lora)")
    shared_prefix_caches: bool = Field(
        False, description="the prefix caches (vLLM's, salted per tenant, and the scored "
        "cache) are each tenant's own unless true: a shared cache lets a tenant time whether "
        "another sent a prompt")
    batch_invariant: bool = Field(
        False, description="vLLM's batch-invariant mode: a request's numbers the same bits "
        "whatever else is in flight, at a cost in throughput; GPUs of compute capability 8.0 "
        "or later only, refused at load elsewhere (the CPU engine is batch-invariant as it is)")

    def largest_full_vocab_window(self) -> int:
        """The most positions one full-vocabulary window can show: the replica rounds the
        window down to whole KV blocks, at least one (vLLM's default block, 128 at most)."""
        return max(self.full_vocab_window, self.kv_block_size or LARGEST_DEFAULT_KV_BLOCK)

    def prefix_block_tokens(self) -> int:
        """The router's prefix blocks: the KV block where set, else vLLM's GPU block (16), which
        divides its CPU one (128): a match is measured in blocks no larger than the engine's."""
        return self.kv_block_size or SMALLEST_DEFAULT_KV_BLOCK

    @model_validator(mode="after")
    def path_or_embedded(self) -> "ModelConfig":
        if self.path is None and self.name not in BUILDERS:
            raise ValueError(
                f"model {self.name!r} needs a path: embedded models are {sorted(BUILDERS)}"
            )
        return self

    def resolved_path(self) -> Path:
        return Path(self.path).expanduser() if self.path else embedded_model_path(self.name)

    @model_validator(mode="after")
    def backend_fits_devices(self) -> "ModelConfig":
        check_backend(self.executor_backend(), self.parallelism(), self.ray_actor_options)
        return self

    @model_validator(mode="after")
    def batch_invariance_on_gpus(self) -> "ModelConfig":
        if self.batch_invariant and not uses_gpus(self.ray_actor_options):
            raise ValueError(f"model {self.name!r}: batch_invariant needs GPU replicas "
                             f"(ray_actor_options.num_gpus): {WHERE}")
        return self

    def parallelism(self) -> Parallelism:
        return Parallelism(self.tensor_parallel_size, self.pipeline_parallel_size)

    def executor_backend(self) -> str | None:
        return executor_backend(self.parallelism(), self.ray_actor_options, self.distributed_executor_backend)

    def placement(self) -> Placement | None:
        """The replica's placement group when its engine has several workers."""
        return placement(self.parallelism(), self.ray_actor_options, self.executor_backend())

    def workers_per_node(self) -> int:
        return self.parallelism().workers_per_node(self.executor_backend())

    def replica_reserves(self) -> dict[str, Any]:
        """What one replica reserves, workers included, as ray_actor_options."""
        group = self.placement()
        return group.reserved() if group else self.ray_actor_options


class IngressConfig(Strict):
    """The ingress deployment: parsing, admission, limits (serve_app.front.ingress)."""

    max_body_bytes: int = Field(16 << 20, ge=1024, description="larger bodies get 413 as soon "
                                "as that many bytes have arrived")
    max_batch_prompts: int = Field(64, ge=1, description="prompts in one request")
    max_n: int = Field(16, ge=1, description="choices per prompt")
    max_full_vocab_requests: int = Field(
        2, ge=1, description="`prompt_logprobs: -1` requests one ingress replica holds at once, "
        "from the replica call to the last byte; the others wait for a slot")
    full_vocab_wait_s: float = Field(30, ge=0, description="how long a full-vocabulary request "
                                     "waits for a slot before 503 `overloaded`")
    max_full_vocab_waiting: int = Field(16, ge=0, description="full-vocabulary requests that "
                                        "wait for a slot at most; more get 503 `overloaded`")
    retry_after_s: int = Field(1, ge=0, description="`Retry-After` (seconds) of a 503")
    readiness_timeout_s: float = Field(5, gt=0, description="how long /health waits for a "
                                       "model's health check before it calls the model not ready")
    max_ongoing_requests: int = Field(
        1024, ge=1, description="requests one ingress replica works on at once; it only parses, "
        "tokenizes and awaits replicas, and must cover what its models take and queue "
        "(checked at load)")
    ui: bool = Field(True, description="the token-probability viewer at /ui; false: /ui "
                     "answers 404 `not_found`")
    autoscaling_config: Autoscaling = autoscaling_of("the ingress")
    ray_actor_options: dict[str, Any] = actor_options_of("each ingress replica", num_cpus=0.25)


class SerializerPoolConfig(Strict):
    """The CPU workers that write full-vocabulary JSON (serve_app.fullvocab.pool)."""

    chunk_positions: int = Field(
        16, ge=1, description="full-vocabulary positions per chunk: the unit a model replica "
        "puts in Ray's object store and a pool worker writes as `.npy`")
    json_piece_bytes: int = Field(
        8 << 20, ge=1, description="the plain JSON a pool worker writes in one call, in whole "
        "positions (at least one): what the ingress holds per call in flight; gzip is written "
        "a chunk a call")
    window: int = Field(4, ge=1, description="calls of one response in the pool or written and "
                        "unsent: how many workers serve one response at once, and how far a "
                        "slow client lets production run ahead")
    max_ongoing_requests: int = Field(
        2, ge=1, description="calls one worker takes at once: it writes one at a time (a "
        "worker is a core's work) and holds the next ready, to start the moment the first ends")
    niceness: int = Field(10, ge=0, le=19, description="the workers' nice value: on shared "
                          "cores the engines, the ingress and the proxy go first; 0: as equals")
    autoscaling_config: Autoscaling = autoscaling_of("the workers")
    ray_actor_options: dict[str, Any] = actor_options_of("each worker", num_cpus=0.5)


class BatchConfig(Strict):
    """OpenAI's Files and Batch APIs (serve_app.batch, docs/operations.md "Batches")."""

    storage: str | None = Field(
        None, description="the folder of uploaded files, batch records and results, which "
        "every ingress replica and the batch runner must see (a shared volume on a cluster); "
        "none: PROBSERVE_HOME/batch")
    max_file_bytes: int = Field(200 << 20, ge=1024, description="the largest upload (OpenAI's bound)")
    max_lines: int = Field(50_000, ge=1, description="the most requests in one batch (OpenAI's bound)")
    lines_in_flight: int = Field(
        8, ge=1, description="lines the runner sends at once, over all its batches: each takes "
        "one of its tenant's places in flight and one of a model replica's")
    priority: int = Field(
        1, ge=0, description="vLLM's scheduling priority of batch lines and dataset documents, "
        "lower first: above 0, online requests (0) go first and background work takes what "
        "they leave; 0: as equals")
    ray_actor_options: dict[str, Any] = actor_options_of("the batch runner (one replica)", num_cpus=0.1)

    def root(self) -> Path:
        return Path(self.storage) if self.storage else probserve_home() / "batch"


class TenancyConfig(Strict):
    """API keys and per-tenant limits (serve_app.tenants.keyring, docs/tenancy.md)."""

    key_file: str | None = Field(None, description="the tenants and their keys' hashes "
                                 "(`probserve keys create` writes it); none: every request is "
                                 "served without a key")
    secret_file: str | None = Field(None, description="the server secret the key hashes are "
                                    "keyed with (at least 32 bytes), kept apart from the key file")
    require_keys: bool = Field(False, description="a production configuration says so: it is "
                               "refused without a key file")
    reload_s: float = Field(5, gt=0, description="how often the key file is checked for "
                            "changes (keys added or revoked without a restart)")
    storage: str = Field("memory://", pattern=r"^(memory://|redis://\S+)$",
                         description="where request and token rates, usage and the adapters "
                         "loaded at run time are kept: memory:// for one ingress replica, "
                         "redis://host:port/db across all")
    adapter_roots: list[str] = Field(
        [], description="the folders (and their subfolders) POST /v1/load_lora_adapter may load "
        "adapters from, which every model replica's node sees; empty: PROBSERVE_HOME/adapters")
    on_storage_failure: Literal["open", "closed"] = Field(
        "closed", description="when that storage cannot be reached: open serves uncounted, "
        "closed answers 503 `rate_limit_unavailable`; either way it is logged")

    @model_validator(mode="after")
    def keys_where_required(self) -> "TenancyConfig":
        if self.require_keys and not self.key_file:
            raise ValueError("tenancy.require_keys is set: name the tenancy.key_file")
        if bool(self.key_file) != bool(self.secret_file):
            raise ValueError("tenancy.key_file and tenancy.secret_file go together")
        return self

    def resolved_adapter_roots(self) -> list[Path]:
        return [Path(root).expanduser() for root in self.adapter_roots] or [adapters_dir()]


@dataclass(frozen=True)
class Served:
    """What a request's `model` names: a model, or an adapter on one: configured, or loaded at
    run time by a tenant (its owner), each load a revision of its own."""

    model: ModelConfig
    adapter: AdapterConfig | None = None
    owner: str | None = None
    revision: str = ""
    created: int | None = None  # a loaded adapter's load time

    @property
    def name(self) -> str:
        return self.adapter.name if self.adapter else self.model.name


class AppConfig(Strict):
    models: list[ModelConfig] = Field(min_length=1)
    ingress: IngressConfig = IngressConfig()
    serializer_pool: SerializerPoolConfig = SerializerPoolConfig()
    tenancy: TenancyConfig = TenancyConfig()
    batch: BatchConfig = BatchConfig()

    @model_validator(mode="after")
    def unique_names(self) -> "AppConfig":
        names = [served.name for served in self.served_models()]
        if len(names) != len(set(names)):
            raise ValueError(f"model and adapter names must be unique, got {names}")
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
                *((m.replica_reserves(), m.autoscaling_config) for m in self.models)]

    def model(self, name: str) -> ModelConfig | None:
        return next((model for model in self.models if model.name == name), None)

    def served_models(self) -> list[Served]:
        """Every model, each followed by its adapters."""
        return [served for model in self.models for served in
                (Served(model), *(Served(model, a) for a in (model.lora.adapters if model.lora else [])))]

    @cached_property
    def served_by_name(self) -> dict[str, Served]:
        return {served.name: served for served in self.served_models()}

    def served(self, name: str) -> Served | None:
        return self.served_by_name.get(name)
