"""probserve: prepare models, serve the application."""

import argparse
import signal
import sys
import time
from pathlib import Path

import yaml

from serve_app.ops import local_ray, processes, supervisor
from serve_app.store.model_store import PREPARABLE, prepare
from serve_app.tenants import keyring
from serve_app.tenants.keyring import KeyFile


def serve_config(path: Path) -> tuple[dict, dict, str]:
    """The app's args, http_options and proxy_location from a Serve config file (one
    application)."""
    document = yaml.safe_load(path.read_text())
    applications = document.get("applications") or []
    if len(applications) != 1:
        raise SystemExit(f"{path}: expected exactly one application, found {len(applications)}")
    return (applications[0].get("args") or {}, document.get("http_options") or {},
            document.get("proxy_location", "EveryNode"))


def command_prepare(options: argparse.Namespace) -> None:
    from serve_app.store.home import apply_cache_environment

    unknown = sorted(set(options.names) - set(PREPARABLE))
    if unknown:
        raise SystemExit(f"unknown embedded models or test adapters {unknown}; choose from {PREPARABLE}")
    apply_cache_environment()
    for name in options.names or PREPARABLE:
        prepare(name)


def key_files(options: argparse.Namespace) -> tuple[KeyFile, bytes]:
    """The key file (empty if it does not exist yet) and the server secret (made, only readable
    by its owner, if its file does not exist yet)."""
    if not options.secret_file.exists():
        options.secret_file.touch(mode=0o600)
        options.secret_file.write_text(keyring.new_secret() + "\n")
        print(f"wrote a new server secret to {options.secret_file}: keep it apart from the key file")
    keys = KeyFile.read(options.key_file) if options.key_file.exists() else KeyFile()
    return keys, keyring.read_secret(options.secret_file)


def command_keys_create(options: argparse.Namespace) -> None:
    keys, secret = key_files(options)
    keys, key = keyring.create_key(keys, options.tenant, secret)
    keys.write(options.key_file)
    print(f"key {keys.keys[-1].id} for tenant {options.tenant!r}, shown this once:\n{key}")


def command_keys_list(options: argparse.Namespace) -> None:
    keys = KeyFile.read(options.key_file)
    for key in keys.keys:
        print(f"{key.id}  {key.tenant}  {key.created.isoformat()}  {'revoked' if key.revoked else 'active'}")


def command_keys_revoke(options: argparse.Namespace) -> None:
    try:
        keyring.revoke_key(KeyFile.read(options.key_file), options.id).write(options.key_file)
    except KeyError:
        raise SystemExit(f"{options.key_file} has no key {options.id}") from None
    print(f"key {options.id} revoked; running services stop taking it within their reload_s")


def command_serve(options: argparse.Namespace) -> None:
    args, http, proxy_location = serve_config(options.config)
    host = options.host or http.get("host", "127.0.0.1")
    port = options.port or http.get("port", 8000)
    if options.driver:
        serve_here(args, host, port, options.metrics_port, proxy_location)
        return
    key_file = (args.get("tenancy") or {}).get("key_file")
    print(f"API keys: from {key_file}" if key_file else
          "API keys: none configured, every request is served without a key (tenancy.key_file "
          "in the Serve config turns keys on)", flush=True)
    if options.address:
        deploy_on_cluster(args, host, port, options.address, proxy_location)
        return
    driver = [sys.executable, "-m", "serve_app.ops.cli", "serve", "--config", str(options.config),
              "--host", host, "--port", str(port), "--metrics-port", str(options.metrics_port), "--driver"]
    ports = {"HTTP": port, "Ray's metrics": options.metrics_port}
    if local_ray.ray_environment()[local_ray.HAPROXY] == "1":
        ports.update(processes.haproxy_ports())
    sys.exit(supervisor.supervise(driver, ports))


def deploy_on_cluster(args: dict, host: str, port: int, address: str, proxy_location: str) -> None:
    started = time.monotonic()
    try:
        url = local_ray.start(args, host=host, port=port, address=address, proxy_location=proxy_location)
    except ConnectionError as error:
        raise SystemExit(f"cannot join the Ray cluster at {address}: {error}. A cluster with "
                         "Ray's token authentication needs RAY_AUTH_MODE=token and its token "
                         "(RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH) in this command's environment") from None
    print(f"probserve is deployed on the Ray cluster at {address} and serving at {url} (ready in "
          f"{time.monotonic() - started:.0f} s); it stays there after this command ends", flush=True)


def serve_here(args: dict, host: str, port: int, metrics_port: int, proxy_location: str) -> None:
    """The Ray driver under `probserve serve`'s supervisor (serve_app.ops.supervisor): Ray on
    this machine and the application, until SIGTERM or Ctrl-C, then Serve and Ray stopped."""
    supervisor.exit_on_sigterm()
    started = time.monotonic()
    try:
        url = local_ray.start(args, host=host, port=port, metrics_port=metrics_port,
                              proxy_location=proxy_location)
        print(f"probserve is serving at {url} (ready in {time.monotonic() - started:.0f} s), metrics at "
              f"http://{host}:{metrics_port}/metrics; Ctrl-C stops it", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        for stop_signal in (signal.SIGINT, signal.SIGTERM):  # a second one cuts nothing short
            signal.signal(stop_signal, signal.SIG_IGN)
        local_ray.stop()


def command_score(options: argparse.Namespace) -> None:
    from serve_app.batch.dataset import ScoreOptions
    from serve_app.batch.scoring import score_dataset
    from serve_app.errors import APIError

    asked = ScoreOptions(model=options.model, column=options.column, id_column=options.id_column,
                         top_k=options.top_k, labels=tuple(options.labels or ()),
                         full_vocab=options.full_vocab, tenant=options.tenant)
    try:
        run = score_dataset(options.input, options.output, asked, address=options.address,
                            app_name=options.app, shard_rows=options.shard_rows, scorers=options.scorers,
                            in_flight=options.in_flight)
    except APIError as error:
        raise SystemExit(f"probserve score: {error.message} ({error.code})") from None
    print(f"scored {run.documents - run.refused} documents ({run.scored_tokens} tokens, "
          f"{run.tokens_per_s:.0f} tokens/s), refused {run.refused} (their rows say why); "
          f"{run.parts_written} parts written, {run.parts_skipped} done before, in {options.output}")


def score_arguments(score: argparse.ArgumentParser) -> None:
    score.add_argument("input", help="a .jsonl or .parquet file, or a folder of them (a path, or a URL "
                       "pyarrow's filesystems take: s3://, gs://, hdfs://)")
    score.add_argument("--model", required=True, help="a model the running service serves")
    score.add_argument("--output", required=True, help="the folder of Parquet parts (path or URL); "
                       "a rerun into it skips the parts already there")
    score.add_argument("--column", default="text", help="the documents: a text, token ids or chat "
                       "messages a row (default %(default)s)")
    score.add_argument("--id-column", help="a column carried to the output beside `row`")
    score.add_argument("--top-k", type=int, default=0, help="the top k of each position too")
    score.add_argument("--labels", type=int, nargs="+", metavar="ID",
                       help="these token ids' logprobs at the position after each document")
    score.add_argument("--full-vocab", action="store_true", help="every token's logprob at every "
                       "position, a fixed-size float32 list a position (lower --in-flight: a group's "
                       "rows are held whole)")
    score.add_argument("--tenant", default="", help="whose prefix caches the requests share")
    score.add_argument("--address", help="the Ray cluster's GCS address (default: this machine's)")
    score.add_argument("--app", default="probserve", help="the Serve application (default %(default)s)")
    score.add_argument("--shard-rows", type=int, default=64, help="documents a part (default %(default)s)")
    score.add_argument("--scorers", type=int, default=1,
                       help="Ray Data's scorer actors (default %(default)s)")
    score.add_argument("--in-flight", type=int, default=16,
                       help="documents each scorer has in the engine at once (default %(default)s)")
    score.set_defaults(run=command_score)


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="probserve", description=__doc__)
    commands = root.add_subparsers(dest="command", required=True)

    models = commands.add_parser("models", help="the model store").add_subparsers(
        dest="action", required=True)
    prep = models.add_parser("prepare", help="build embedded models and test adapters (idempotent)")
    prep.add_argument("names", nargs="*", metavar="NAME",
                      help=f"models and adapters to build (default: all of {', '.join(PREPARABLE)})")
    prep.set_defaults(run=command_prepare)

    serve = commands.add_parser("serve", help="start Ray, Serve and the app on this machine, "
                                "or put the app on a running Ray cluster (--address)")
    serve.add_argument("--config", type=Path, default=Path("deployments/local.yaml"))
    serve.add_argument("--address", help="a running Ray cluster's GCS address (HEAD:6379, or "
                       "`auto` on one of its nodes): deploy the app there and return, instead of "
                       "starting Ray here")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--metrics-port", type=int, default=local_ray.METRICS_PORT,
                       help="Ray's metrics export port, where Prometheus scrapes every process's "
                            "metrics (default %(default)s; a cluster joined with --address has its own)")
    # The supervisor starts the command again as its Ray driver (serve_app.ops.supervisor).
    serve.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)
    serve.set_defaults(run=command_serve)

    score_arguments(commands.add_parser("score", help="score a dataset on Ray Data into Parquet, "
                                        "through the running service's models (docs/api.md)"))

    keys = commands.add_parser("keys", help="API keys (docs/tenancy.md)").add_subparsers(
        dest="action", required=True)
    for name, run, help_text in [("create", command_keys_create, "make a key for a tenant; prints it once"),
                                 ("list", command_keys_list, "the keys: id, tenant, created, state"),
                                 ("revoke", command_keys_revoke, "revoke a key by its id")]:
        action = keys.add_parser(name, help=help_text)
        action.add_argument("--key-file", type=Path, required=True)
        action.set_defaults(run=run)
    keys.choices["create"].add_argument("--tenant", required=True)
    keys.choices["create"].add_argument("--secret-file", type=Path, required=True)
    keys.choices["revoke"].add_argument("id")
    return root


def main(argv: list[str] | None = None) -> None:
    options = parser().parse_args(argv)
    options.run(options)


if __name__ == "__main__":
    main()
