"""A real Prometheus server (Debian's `prometheus` package) scraping the test service with the
scrape configuration probserve ships (grafana/prometheus.yml), every 3 s."""

import shutil
import subprocess
import time
from pathlib import Path

import httpx
import yaml

GRAFANA = Path(__file__).resolve().parents[2] / "grafana"
# A scrape may take as long as its interval. Late in the suite Ray's metrics agent takes 0.8 s
# on average and up to 1.2 s to render its page on a loaded machine: with 1 s scrapes, two in
# three failed in the tenancy tests, and a failed scrape marks every series stale, so queries
# saw nothing for minutes.
SCRAPE_INTERVAL_S = 3


def config(metrics_target: str) -> dict:
    shipped = yaml.safe_load((GRAFANA / "prometheus.yml").read_text())
    interval = f"{SCRAPE_INTERVAL_S}s"
    shipped["global"] = {"scrape_interval": interval, "scrape_timeout": interval,
                         "evaluation_interval": interval}
    shipped["rule_files"] = [str(GRAFANA / "alerts.yml")]
    (job,) = shipped["scrape_configs"]
    job["static_configs"] = [{"targets": [metrics_target]}]
    return shipped


class Prometheus:
    def __init__(self, metrics_target: str, folder: Path, port: int):
        binary = shutil.which("prometheus")
        assert binary, "prometheus is not installed: `make test` installs Debian's package"
        config_file = folder / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config(metrics_target)))
        self.url = f"http://127.0.0.1:{port}"
        self.log = (folder / "prometheus.log").open("wb")
        self.process = subprocess.Popen(
            [binary, f"--config.file={config_file}", f"--storage.tsdb.path={folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"], stdout=self.log, stderr=subprocess.STDOUT)
        self.wait_ready()

    def wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "prometheus exited: see prometheus.log"
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError("prometheus did not become ready")

    def query(self, promql: str) -> list[dict]:
        """An instant query's result vector (or an empty list)."""
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=30)
        assert response.status_code == 200, response.text
        return response.json()["data"]["result"]

    def value(self, promql: str) -> float:
        """A query that names one series: its value, or 0 when there is none yet."""
        result = self.query(promql)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else 0.0

    def metric_names(self) -> set[str]:
        response = httpx.get(f"{self.url}/api/v1/label/__name__/values", timeout=30)
        return set(response.json()["data"])

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)
        self.log.close()
