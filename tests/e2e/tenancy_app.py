"""The tenancy application the tenancy and isolation tests share, for the whole session: two
ingress replicas that share one real Redis (Debian's redis-server, started here), keys for
five tenants, the inspected model replica (tests/e2e/inspected_replica.py)."""

import shutil
import subprocess
import time

import httpx
import pytest
from ray import serve

from serve_app.ops.app import build_app
from serve_app.store.adapter_store import adapter_name, adapter_path
from serve_app.store.model_store import TINY, TINY_BOS
from serve_app.tenants import keyring
from serve_app.tenants.keyring import KeyFile, Tenant, TenantCaps, TenantLimits
from tests.e2e.conftest import IN_ENGINE_CORE, TINY_KV_GIB, free_port
from tests.e2e.inspected_replica import INSPECTED_REPLICA

APP, PREFIX = "tenancy", "/tenancy"
REQUESTS_PER_MINUTE = 8  # alpha's
VIEWER_REQUESTS_PER_MINUTE = 3  # the viewer test's tenant's
INGRESS_REPLICAS = 2
# flood's bound in flight (per ingress replica) and its queue: the fairness test's clients.
FLOOD_MAX_IN_FLIGHT, FLOOD_CLIENTS = 1, 8
TUNER_ROOT = adapter_path(adapter_name(TINY, 8))  # the one folder tuner may load adapters from


class RedisServer:
    def __init__(self, port: int, folder):
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed: `make test` installs Debian's package"
        self.command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                        "--appendonly", "no", "--dir", str(folder)]
        self.port = port
        self.start()

    def start(self) -> None:
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True,
                             text=True).stdout.strip() != "PONG":
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    server = RedisServer(free_port(), tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def keys(tmp_path_factory):
    """alpha: the first tiny model only, tighter caps, a request rate, two in flight; beta:
    both models, no limits; gamma: a key that gets revoked; flood: one in flight, eight
    waiting; viewer: the first model only, three requests a minute; evaluator: the first model
    only, no limits (lm-evaluation-harness's remote tokenizer names no model); tuner: one LoRA
    adapter loaded at a time, from the rank-8 test adapter's folder only."""
    folder = tmp_path_factory.mktemp("keys")
    secret_file, key_file = folder / "secret", folder / "keys.yaml"
    secret_file.write_text(keyring.new_secret())
    secret = keyring.read_secret(secret_file)
    made, document = {}, KeyFile(tenants={
        "alpha": Tenant(models=[TINY], caps=TenantCaps(max_logprobs=2),
                        limits=TenantLimits(requests_per_minute=REQUESTS_PER_MINUTE, max_in_flight=2)),
        "beta": Tenant(), "gamma": Tenant(),
        "flood": Tenant(limits=TenantLimits(max_in_flight=FLOOD_MAX_IN_FLIGHT, max_waiting=FLOOD_CLIENTS)),
        "viewer": Tenant(models=[TINY], limits=TenantLimits(requests_per_minute=VIEWER_REQUESTS_PER_MINUTE)),
        "evaluator": Tenant(models=[TINY]),
        "tuner": Tenant(limits=TenantLimits(max_adapters=1, adapter_roots=[str(TUNER_ROOT)]))})
    for name in ("alpha", "beta", "gamma", "flood", "viewer", "evaluator", "tuner"):
        document, made[name] = keyring.create_key(document, name, secret)
    document.write(key_file)
    return {"key_file": key_file, "secret_file": secret_file, "made": made}


@pytest.fixture(scope="session")
def app_args(redis_server, keys, tmp_path_factory) -> dict:
    tiny = {"capabilities": {"max_logprobs": 5, "max_model_len": 512}, "cpu_kv_cache_gib": TINY_KV_GIB,
            "ray_actor_options": {"num_cpus": 0.01}, **IN_ENGINE_CORE}
    # The second model is only listed and refused here, never sent to: scaled to zero, it
    # costs no engine.
    idle = {"autoscaling_config": {"min_replicas": 0, "max_replicas": 1}}
    # LoRA adapters up to rank 8: the store's rank-16 adapter is one too many.
    lora = {"lora": {"max_lora_rank": 8}}
    args = {"models": [{"name": TINY, **tiny, **lora}, {"name": TINY_BOS, **tiny, **idle}],
            "ingress": {"autoscaling_config": {"min_replicas": INGRESS_REPLICAS,
                                               "max_replicas": INGRESS_REPLICAS},
                        "ray_actor_options": {"num_cpus": 0.01}},
            "serializer_pool": {"ray_actor_options": {"num_cpus": 0.01}},
            "tenancy": {"key_file": str(keys["key_file"]), "secret_file": str(keys["secret_file"]),
                        "reload_s": 1, "storage": f"redis://127.0.0.1:{redis_server.port}/0"},
            "batch": {"storage": str(tmp_path_factory.mktemp("tenancy-batch")),
                      "ray_actor_options": {"num_cpus": 0.01}}}
    return args


def deploy(app_args: dict, url: str) -> None:
    """The application, on the replica the tests inspect (tests/e2e/inspected_replica.py),
    once both ingress replicas count the model's replica: `serve.run` returns as soon as the
    controller has it running, and an ingress replica that counted none a moment before still
    refuses it for up to a second (serve_app.front.replica_client.check_started)."""
    serve.run(build_app(app_args, INSPECTED_REPLICA), name=APP, route_prefix=PREFIX)
    deadline, ready_in_a_row = time.monotonic() + 60, 0
    while ready_in_a_row < 2 * INGRESS_REPLICAS:
        assert time.monotonic() < deadline, "an ingress replica never counted the model's replica"
        ready = httpx.get(f"{url}/health", params={"model": TINY}).status_code == 200
        ready_in_a_row = ready_in_a_row + 1 if ready else 0
        time.sleep(0.25)


@pytest.fixture(scope="session")
def tenancy_url(base_url, app_args):
    url = f"{base_url}{PREFIX}"
    deploy(app_args, url)
    yield url
    serve.delete(APP)


def as_(keys, name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {keys['made'][name]}"}
