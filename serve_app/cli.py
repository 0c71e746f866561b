"""probserve: prepare models, serve the application."""

import argparse
import signal
import sys
import time
from pathlib import Path

import yaml

from serve_app import local
from serve_app.models import BUILDERS, prepare


def serve_config(path: Path) -> tuple[dict, dict]:
    """The app's args and http_options from a Serve config file (one application)."""
    document = yaml.safe_load(path.read_text())
    applications = document.get("applications") or []
    if len(applications) != 1:
        raise SystemExit(f"{path}: expected exactly one application, found {len(applications)}")
    return applications[0].get("args") or {}, document.get("http_options") or {}


def command_prepare(options: argparse.Namespace) -> None:
    from serve_app.home import apply_cache_environment

    unknown = sorted(set(options.names) - set(BUILDERS))
    if unknown:
        raise SystemExit(f"unknown embedded models {unknown}; choose from {sorted(BUILDERS)}")
    apply_cache_environment()
    for name in options.names or sorted(BUILDERS):
        prepare(name)


def command_serve(options: argparse.Namespace) -> None:
    args, http = serve_config(options.config)
    host = options.host or http.get("host", "127.0.0.1")
    port = options.port or http.get("port", 8000)
    started = time.monotonic()
    url = local.start(args, host=host, port=port, metrics_port=options.metrics_port)
    print(f"probserve is serving at {url} (ready in {time.monotonic() - started:.0f} s), "
          f"metrics at http://{host}:{options.metrics_port}/metrics; Ctrl-C stops it", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            time.sleep(3600)
    except (KeyboardInterrupt, SystemExit):
        local.stop()


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="probserve", description=__doc__)
    commands = root.add_subparsers(dest="command", required=True)

    models = commands.add_parser("models", help="the model store").add_subparsers(
        dest="action", required=True)
    prep = models.add_parser("prepare", help="build embedded models (idempotent)")
    prep.add_argument("names", nargs="*", metavar="NAME",
                      help=f"models to build (default: all of {', '.join(sorted(BUILDERS))})")
    prep.set_defaults(run=command_prepare)

    serve = commands.add_parser("serve", help="start Ray, Serve and the app on this machine")
    serve.add_argument("--config", type=Path, default=Path("deployments/local.yaml"))
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--metrics-port", type=int, default=local.METRICS_PORT,
                       help="Ray's metrics export port, where Prometheus scrapes every process's "
                            "metrics (default %(default)s)")
    serve.set_defaults(run=command_serve)
    return root


def main(argv: list[str] | None = None) -> None:
    options = parser().parse_args(argv)
    options.run(options)


if __name__ == "__main__":
    main()
