"""One real service for the whole session: Ray Serve, the app, vLLM on three tiny models, one
per tokenizer family (the first is the one most tests use), a sibling of the first (its
tokenizer, other weights: the viewer compares the two; two replicas, for the models' router's
prefix routing), and the embedded default model, on which the documentation's examples run
as they are written. The SentencePiece model scales
as deployments/autoscaling.yaml says (tests/e2e/test_autoscaling.py)."""

import os
import pathlib
import random
import socket

import httpx
import pytest
import yaml

from serve_app.ops import local_ray
from serve_app.store.adapter_store import ADAPTER_RANKS, adapter_name
from serve_app.store.model_store import (
    SMOLLM2,
    TINY,
    TINY_BOS,
    TINY_SENTENCEPIECE,
    TINY_SIBLING,
    embedded_model_path,
)
from tests.e2e.inspected_replica import INSPECTED_REPLICA
from tests.e2e.prometheus import Prometheus
from tests.e2e.reference import Reference

MODEL = TINY
FAMILIES = [TINY, TINY_BOS, TINY_SENTENCEPIECE]
# The main model again, its engine split across two CPU workers: tensor ranks, pipeline stages
# (tests/e2e/test_parallel.py compares their answers with the one-worker engine's). Scaled to
# zero but while their tests run: three processes an engine would take the memory and cores
# the others start and run on.
SPLIT_MODELS = {f"{TINY}-tp2": {"tensor_parallel_size": 2}, f"{TINY}-pp2": {"pipeline_parallel_size": 2}}
WHILE_USED = {"min_replicas": 0, "max_replicas": 1, "upscale_delay_s": 0, "downscale_to_zero_delay_s": 60}
MAX_LOGPROBS = 20
MAX_LABELS = 16
MAX_MODEL_LEN = 512
FULL_VOCAB_MAX = 300  # three windows of full-vocabulary rows (below MAX_SCORED)
FULL_VOCAB_WINDOW = 128  # one KV block of vLLM's CPU default
CHUNK_POSITIONS = 8  # a test prompt's rows come in several chunks
# vLLM's KV block on the CPU is 128 tokens unless configured: one family runs on blocks of 32,
# whose full-vocabulary windows begin with one block and whose prefix caches reuse 32 at a
# time (SMOLLM2 keeps vLLM's default).
KV_BLOCKS = {TINY: 128, TINY_BOS: 128, TINY_SENTENCEPIECE: 32, **dict.fromkeys(SPLIT_MODELS, 128)}
ONE_WINDOW = 128  # the full-vocabulary prompt the load and pool tests send: 127 rows, one window
MAX_SCORED = 320  # a prompt of two KV blocks and more, echoed whole (test_prefix_reuse.py)
# KV cache: a tiny model's token takes 1 KiB, so 64 MiB holds 65,536 of them; SmolLM2's 23 KiB,
# so 256 MiB holds 11,000. vLLM allocates it all at start, and the session's engines, with
# the tests' own, would otherwise fill this machine's memory and evict its page cache.
TINY_KV_GIB, SMOLLM2_KV_GIB = 1 / 16, 1 / 4
# The tiny models compute in vLLM's engine-core process: a process fewer each, whose start
# and idle polling the suite's engines would otherwise pay; SmolLM2 keeps the CPU default, a
# worker process of its own (deployments/local.yaml's).
IN_ENGINE_CORE = {"distributed_executor_backend": "uni"}
BATCH_MAX_FILE_BYTES = 1 << 20
# Background prompts on the main model go a window at a time even with no online request
# about (its tests count the windows); on the others, whole after a second of no online one.
WINDOWS_ALWAYS_S, BACKGROUND_QUIET_S = 24 * 3600, 1
CAPABILITIES = {"max_logprobs": MAX_LOGPROBS, "max_logprob_token_ids": MAX_LABELS,
                "max_model_len": MAX_MODEL_LEN, "full_vocab_max_prompt_tokens": FULL_VOCAB_MAX,
                "max_scored_tokens": MAX_SCORED}
# The overload tests flood this one: it takes 2 requests at once and queues 2 more for at
# most a second; the fault tests kill its engine, and Ray Serve checks its health every 2 s.
SMALL_QUEUE_MODEL, SMALL_QUEUE = TINY_BOS, {"max_ongoing_requests": 2, "max_queued_requests": 2,
                                            "max_queue_wait_s": 1, "health_check_period_s": 2}
# A scored-prefix cache of a few contexts (two 128-position blocks of top-5 rows are 26 kB):
# a flood of distinct ones evicts (test_prefix_reuse.py).
SMALL_CACHE_MODEL, SMALL_CACHE_BYTES = TINY_BOS, 80_000
# An engine step of this one computes at most 128 tokens: a longer prompt is split across
# steps, at other places alone than among others (vLLM's chunked prefill; test_determinism.py).
STEP_TOKENS = {TINY_SENTENCEPIECE: 128}
# The autoscaling test loads this one: one replica at rest, two under load, as the demo file
# scales its model.
AUTOSCALING_FILE = pathlib.Path(__file__).parents[2] / "deployments" / "autoscaling.yaml"
AUTOSCALING_MODEL = TINY_SENTENCEPIECE
AUTOSCALING = {field: value for field, value in yaml.safe_load(AUTOSCALING_FILE.read_text())
               ["applications"][0]["args"]["models"][0].items()
               if field in ("autoscaling_config", "max_ongoing_requests", "max_queued_requests")}
# The sibling runs two replicas: the models' router keeps each prefix on one of them
# (tests/e2e/test_prefix_routing.py); 32 requests in flight each, within the ingress's bound.
PREFIX_ROUTED = {"autoscaling_config": {"min_replicas": 2, "max_replicas": 2},
                 "max_ongoing_requests": 32, "max_queued_requests": 32}
# Each family's model serves the store's two LoRA adapters of it, rank 8 and 16
# (tests/e2e/test_adapters.py); at most both in one engine step.
# The main model also serves an adapter whose folder is on no node: its replica refuses it.
ADAPTERS = {name: [adapter_name(name, rank) for rank in ADAPTER_RANKS] for name in FAMILIES}
MISSING_ADAPTER, MISSING_ADAPTER_PATH = f"{MODEL}-lora-gone", "/nonexistent/probserve/adapters/gone"
SERVED_ADAPTERS = {name: [{"name": a} for a in adapters]
                   + ([{"name": MISSING_ADAPTER, "path": MISSING_ADAPTER_PATH}] if name == MODEL else [])
                   for name, adapters in ADAPTERS.items()}
LORA = {name: {"max_lora_rank": 16, "max_loras": 2, "adapters": adapters}
        for name, adapters in SERVED_ADAPTERS.items()}
CONFIG = {
    "models": [{"name": name, "capabilities": CAPABILITIES, "ray_actor_options": {"num_cpus": 0.5},
                "lora": LORA[name], **IN_ENGINE_CORE,
                "cpu_kv_cache_gib": TINY_KV_GIB,
                "full_vocab_window": FULL_VOCAB_WINDOW,
                "kv_block_size": KV_BLOCKS[name],
                "background_window": KV_BLOCKS[name],  # a batch line's prompt in several windows
                "background_quiet_s": WINDOWS_ALWAYS_S if name == MODEL else BACKGROUND_QUIET_S,
                **(SMALL_QUEUE if name == SMALL_QUEUE_MODEL else {}),
                **({"scored_cache": {"max_bytes": SMALL_CACHE_BYTES}} if name == SMALL_CACHE_MODEL else {}),
                **(AUTOSCALING if name == AUTOSCALING_MODEL else {}),
                **({"max_num_batched_tokens": STEP_TOKENS[name]} if name in STEP_TOKENS else {})}
       for name in FAMILIES]
    + [{"name": TINY_SIBLING, "capabilities": CAPABILITIES, "ray_actor_options": {"num_cpus": 0.1},
        "cpu_kv_cache_gib": TINY_KV_GIB, **IN_ENGINE_CORE, **PREFIX_ROUTED}]
    + [{"name": name, "path": str(embedded_model_path(TINY)), "capabilities": CAPABILITIES,
        "ray_actor_options": {"num_cpus": 0.1}, "cpu_kv_cache_gib": TINY_KV_GIB,
        "full_vocab_window": FULL_VOCAB_WINDOW, "kv_block_size": KV_BLOCKS[name],
        "max_ongoing_requests": 32, "max_queued_requests": 32, "autoscaling_config": WHILE_USED, **layout}
       for name, layout in SPLIT_MODELS.items()]
    # LoRA on the embedded model: docs/api.md's examples load its test adapter at run time.
    + [{"name": SMOLLM2, "ray_actor_options": {"num_cpus": 0.5}, "cpu_kv_cache_gib": SMOLLM2_KV_GIB,
        "lora": {"max_lora_rank": 16}}],
    # Full-vocabulary requests wait up to 120 s for a slot (30 by default), so that on a slow
    # machine every waiter of test_overload.py's burst is served.
    "ingress": {"max_batch_prompts": 8, "max_n": 4, "max_ongoing_requests": 1024, "full_vocab_wait_s": 120},
    # Two workers, so that every full-vocabulary response is written by both at once; chunks
    # of 8 positions, so that a test prompt has several, and JSON pieces of 3 tiny positions
    # (270 kB each), so that a chunk is written in several calls.
    "serializer_pool": {"chunk_positions": CHUNK_POSITIONS, "json_piece_bytes": 810_000,
                        "autoscaling_config": {"min_replicas": 2, "max_replicas": 2},
                        "ray_actor_options": {"num_cpus": 0.1}},
    # Uploads of at most a MiB, so that one past the cap is cheap to send (test_batch.py).
    "batch": {"max_file_bytes": BATCH_MAX_FILE_BYTES},
}


def free_port() -> int:
    """A free port below Linux's ephemeral range (32768+), where Ray's own processes take
    theirs while it starts: an ephemeral port free now may not be free for Serve's proxy."""
    for port in random.sample(range(20000, 30000), 200):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port between 20000 and 30000")


@pytest.fixture(scope="session")
def metrics_port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def base_url(metrics_port, tmp_path_factory):
    # Ray's processes report their metrics to the node's agent every 2 s instead of 10, so
    # that the metrics tests wait less for what they sent to show (every second costs the
    # tenancy test's flood measurable CPU).
    os.environ["RAY_metrics_report_interval_ms"] = "2000"
    # Many engines share these two cores: an OpenMP thread that waits sleeps instead of
    # spinning, so one engine's steps do not starve another's start (a replica added under
    # load started in 65 s instead of 92 s).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # The session's batches and files in a folder of its own, never one a run before left.
    batch = {**CONFIG["batch"], "storage": str(tmp_path_factory.mktemp("batch"))}
    url = local_ray.start({**CONFIG, "batch": batch}, port=free_port(), log_to_driver=False,
                          metrics_port=metrics_port, replica=INSPECTED_REPLICA)
    yield url
    local_ray.stop()


@pytest.fixture(scope="session")
def metrics_url(base_url, metrics_port):
    """Ray's metrics agent, which exports the service's metrics."""
    return f"http://127.0.0.1:{metrics_port}/metrics"


@pytest.fixture(scope="module")
def prometheus(base_url, metrics_port, tmp_path_factory):
    """A real Prometheus scraping the service (Debian's package, installed by `make test`), for
    the tests of one module: each scrape costs Ray's metrics agent 0.3-1 s of CPU to render
    thousands of series, which every later test would pay for."""
    server = Prometheus(f"127.0.0.1:{metrics_port}", tmp_path_factory.mktemp("prometheus"), free_port())
    yield server
    server.stop()


@pytest.fixture(scope="session")
def http(base_url):
    with httpx.Client(base_url=base_url, timeout=120) as client:
        yield client


@pytest.fixture(scope="session")
def client(base_url):
    """OpenAI's Python SDK on the service, unchanged (the Files and Batch APIs' tests)."""
    import openai

    with openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0) as client:
        yield client


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory) -> pathlib.Path:
    """Where the viewer's tests save their screenshots: docs/images for `make screenshots`
    (PROBSERVE_SCREENSHOTS=docs), else a folder of the session's, so that a test run leaves
    the checkout as it found it."""
    if os.environ.get("PROBSERVE_SCREENSHOTS") == "docs":
        return pathlib.Path(__file__).parents[2] / "docs" / "images"
    return tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="session")
def references():
    """The float32 reference of each model, loaded once."""
    return {name: Reference(embedded_model_path(name)) for name in FAMILIES}


@pytest.fixture(scope="session")
def reference(references):
    return references[MODEL]


@pytest.fixture(scope="session")
def complete(http):
    """POSTs a completion request (model filled in) and returns the JSON of a 200."""
    def post(**body):
        response = http.post("/v1/completions", json={"model": MODEL, **body})
        assert response.status_code == 200, response.text
        return response.json()
    return post


# The tenancy application's fixtures, for every module that uses it (below: it imports this).
from tests.e2e.tenancy_app import app_args, keys, redis_server, tenancy_url  # noqa: E402, F401
