"""Metrics through a real Prometheus: after a scripted workload, PromQL gives back exactly what
the test sent; every dashboard query and every defined metric has data; the alert rules pass
promtool's checks and tests."""

import random
import re
import subprocess
import time

import httpx
import openai
import pytest

from serve_app.observe.metrics import METRICS
from serve_app.ops.dashboard import PANELS, dashboard_text
from tests.e2e.conftest import MODEL
from tests.e2e.prometheus import GRAFANA, SCRAPE_INTERVAL_S
from tests.e2e.test_batch import request_line, run_batch, scoring
from tests.e2e.test_prefix_reuse import REPORT_S

SETTLE_S = 30  # Ray's report interval (1 s in the tests) plus scrapes, with room to spare
WORKLOAD_MODEL = f'model="{MODEL}"'
METRIC_NAME = r"\b(probserve_\w+|vllm:\w+|ray_serve_\w+)"


def unique_prompt(length: int) -> list[int]:
    """Random token ids: no prefix of one is cached from another request."""
    return [random.randrange(10, 250) for _ in range(length)]


def counters(prometheus) -> dict[str, float]:
    queries = {
        "prompt": f"sum(probserve_prompt_tokens_total{{{WORKLOAD_MODEL}}})",
        "prefill": f"sum(probserve_prefill_tokens_total{{{WORKLOAD_MODEL}}})",
        "cache_read": f"sum(probserve_prefix_cache_read_tokens_total{{{WORKLOAD_MODEL}}})",
        "scored_served": f'sum(probserve_scored_positions_total{{{WORKLOAD_MODEL}, source="cache"}})',
        "prefill_seconds": f"sum(probserve_request_prefill_time_seconds_sum{{{WORKLOAD_MODEL}}})",
        "prefill_requests": f"sum(probserve_request_prefill_time_seconds_count{{{WORKLOAD_MODEL}}})",
        "generation": f"sum(probserve_generation_tokens_total{{{WORKLOAD_MODEL}}})",
        "scored": f"sum(probserve_scored_tokens_total{{{WORKLOAD_MODEL}}})",
        "completion": f"sum(probserve_completion_tokens_total{{{WORKLOAD_MODEL}}})",
        "ok": f'sum(probserve_requests_total{{{WORKLOAD_MODEL}, status="200", code=""}})',
        "invalid": f'sum(probserve_requests_total{{{WORKLOAD_MODEL}, status="400", code="invalid_request"}})',
        "unknown_model": 'sum(probserve_requests_total{model="", status="404", code="model_not_found"})',
        "rows": f'sum(probserve_full_vocab_rows_total{{{WORKLOAD_MODEL}, form="json"}})',
        "queue_time_count": f"sum(probserve_request_queue_time_seconds_count{{{WORKLOAD_MODEL}}})",
    }
    return {name: prometheus.value(query) for name, query in queries.items()}


def settled(prometheus, expected: dict[str, float] | None = None) -> dict[str, float]:
    """The counters once those in `expected` equal it (or, without it, once two readings a few
    seconds apart agree), read again after a pause to be sure nothing more arrives."""
    deadline = time.monotonic() + SETTLE_S
    now = counters(prometheus)
    while time.monotonic() < deadline:
        time.sleep(2 * SCRAPE_INTERVAL_S)  # readings of two different scrapes at least
        previous, now = now, counters(prometheus)
        wanted = expected or previous
        if {name: now[name] for name in wanted} == wanted:
            break
    time.sleep(2 * SCRAPE_INTERVAL_S)
    return counters(prometheus)


def workload(http) -> dict[str, float]:
    """Requests of known size; returns what each counter must grow by, and the wall time."""
    sent = dict.fromkeys(["prompt", "scored", "completion", "ok", "rows", "requests", "cache_read",
                          "scored_served"], 0)
    started = time.monotonic()
    for length in (12, 20, 33):
        body = {"model": MODEL, "prompt": unique_prompt(length), "max_tokens": 3, "echo": True,
                "logprobs": 1, "temperature": 0}
        answer = http.post("/v1/completions", json=body).json()
        sent["prompt"] += length
        sent["scored"] += length
        sent["completion"] += answer["usage"]["completion_tokens"]
    streamed = {"model": MODEL, "prompt": unique_prompt(9), "max_tokens": 4, "stream": True,
                "stream_options": {"include_usage": True}}
    with http.stream("POST", "/v1/completions", json=streamed) as response:
        events = [line for line in response.iter_lines() if line.startswith("data: {")]
    sent["prompt"] += 9
    sent["completion"] += httpx.Response(200, content=events[-1][6:]).json()["usage"]["completion_tokens"]
    full_vocab = {"model": MODEL, "prompt": unique_prompt(17), "max_tokens": 1, "prompt_logprobs": -1}
    answer = http.post("/v1/completions", json=full_vocab, headers={"accept-encoding": "gzip"}).json()
    sent["prompt"] += 17
    sent["scored"] += 17
    sent["rows"] += 16  # position 0 has no distribution
    sent["completion"] += answer["usage"]["completion_tokens"]
    # A span of a 200-token prompt, twice: the second reads the first 128-token block of its
    # prefix from the KV cache (its limit, 149 tokens, cut to whole blocks). Another prompt
    # echoed twice: the second gets rows 1-128 from the scored-prefix cache and reads their
    # block from the KV cache.
    span = {"model": MODEL, "prompt": unique_prompt(200), "max_tokens": 1, "logprob_start_len": 150}
    echo = {"model": MODEL, "prompt": unique_prompt(200), "max_tokens": 1, "echo": True, "logprobs": 1}
    for body, scored in [(span, 50), (span, 50), (echo, 200), (echo, 200)]:
        answer = http.post("/v1/completions", json=body).json()
        sent["prompt"] += 200
        sent["scored"] += scored
        sent["completion"] += answer["usage"]["completion_tokens"]
    sent["cache_read"], sent["scored_served"] = 2 * 128, 128
    sent["requests"] = sent["ok"] = 9
    sent["wall_s"] = time.monotonic() - started
    for body, status in [({"model": MODEL, "prompt": "x", "max_tokens": -1}, 400),
                         ({"model": "no-such-model", "prompt": "x"}, 404)]:
        assert http.post("/v1/completions", json=body).status_code == status
    return sent


def test_counters_equal_what_was_sent(http, prometheus, capsys):
    before = settled(prometheus)
    sent = workload(http)
    expected = {
        **before,
        "prompt": before["prompt"] + sent["prompt"],
        # Random prompts share no cached prefix: every prompt token is computed but the span's.
        "prefill": before["prefill"] + sent["prompt"] - sent["cache_read"],
        "cache_read": before["cache_read"] + sent["cache_read"],
        "scored_served": before["scored_served"] + sent["scored_served"],
        "generation": before["generation"] + sent["completion"],
        "scored": before["scored"] + sent["scored"],
        "completion": before["completion"] + sent["completion"],
        "ok": before["ok"] + sent["ok"],
        "invalid": before["invalid"] + 1,
        "unknown_model": before["unknown_model"] + 1,
        "rows": before["rows"] + sent["rows"],
        "queue_time_count": before["queue_time_count"] + sent["requests"],
        "prefill_requests": before["prefill_requests"] + sent["requests"],
    }
    after = settled(prometheus, {k: v for k, v in expected.items() if k != "prefill_seconds"})
    after_without_time = {k: v for k, v in after.items() if k != "prefill_seconds"}
    assert after_without_time == {k: v for k, v in expected.items() if k != "prefill_seconds"}
    # Each request's prefill took part of its wall time, and the requests ran one at a time:
    # the prefill throughput is at least the tokens over the workload's wall time.
    prefill_seconds = after["prefill_seconds"] - before["prefill_seconds"]
    throughput = sent["prompt"] / prefill_seconds
    assert 0 < prefill_seconds < sent["wall_s"]
    assert throughput >= sent["prompt"] / sent["wall_s"]
    with capsys.disabled():
        print(f"\nprefill: {sent['prompt']} tokens in {prefill_seconds * 1000:.1f} ms of prefill "
              f"({throughput:.0f} tokens/s), {sent['wall_s']:.2f} s of wall time")


def dashboard_queries() -> list[tuple[str, str]]:
    return [(panel.title, expr) for panel in PANELS for expr, _ in panel.queries]


def exported_series(metric) -> str:
    return metric.name + ("_bucket" if metric.kind == "histogram" else "")


def as_run_by_grafana(expr: str) -> str:
    return expr.replace("$__rate_interval", "2m").replace("$model", ".*")


@pytest.fixture(scope="module")
def exported(http, prometheus, base_url):
    """Every metric name Prometheus holds once a workload of every kind, a batch included, has
    been scraped."""
    workload(http)
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0) as client:
        lines = [request_line(str(i), scoring(unique_prompt(8))) for i in range(2)]
        assert run_batch(client, lines).status == "completed"
    wanted = {exported_series(metric) for metric in METRICS} | {
        name for _, expr in dashboard_queries() for name in re.findall(METRIC_NAME, expr)}
    deadline = time.monotonic() + SETTLE_S  # Ray's report, then a scrape, of the last line
    while not wanted <= (names := prometheus.metric_names()) and time.monotonic() < deadline:
        time.sleep(SCRAPE_INTERVAL_S)
    time.sleep(2 * SCRAPE_INTERVAL_S)  # a rate needs two samples of each series
    return names


@pytest.mark.parametrize("title, expr", dashboard_queries())
def test_every_dashboard_query_has_data(prometheus, exported, title, expr):
    for name in re.findall(METRIC_NAME, expr):
        assert name in exported, f"{title}: {name} is not exported"
    end = time.time()
    response = httpx.get(f"{prometheus.url}/api/v1/query_range", timeout=30, params={
        "query": as_run_by_grafana(expr), "start": end - 600, "end": end, "step": 5})
    assert response.status_code == 200, response.text
    assert response.json()["data"]["result"], f"{title}: {expr} returned no data"


def test_gauges_stay_exported_while_nothing_changes_them(http, metrics_url):
    """Ray's agent drops a gauge two report intervals after it was last set: an idle engine's
    running and KV-cache figures and an idle ingress's requests in flight vanished from
    Prometheus, and with them the dashboard's engine panels."""
    held = [f'ray_vllm_num_requests_running{{[^}}]*model_name="{MODEL}"',
            f'ray_vllm_kv_cache_usage_perc{{[^}}]*model_name="{MODEL}"',
            r"ray_probserve_requests_in_flight{[^}]*} 0\.0$"]
    http.post("/v1/completions", json={"model": MODEL, "prompt": unique_prompt(5), "max_tokens": 1})
    time.sleep(3 * REPORT_S)  # the engine and the ingress idle for longer than two intervals
    for _ in range(4):
        text = httpx.get(metrics_url, timeout=30).text
        for series in held:
            assert re.search(series, text, re.MULTILINE), f"{series} is not exported"
        time.sleep(REPORT_S / 2)


def test_every_defined_metric_is_exported(exported):
    for metric in METRICS:
        assert exported_series(metric) in exported, f"{metric.name} is defined but not exported"


def test_the_committed_dashboard_is_the_generated_one():
    assert (GRAFANA / "probserve.json").read_bytes() == dashboard_text(), \
        "run: .venv/bin/python -m serve_app.ops.dashboard"


def test_alert_rules_are_valid_and_their_tests_pass():
    for command in (["promtool", "check", "rules", "alerts.yml"],
                    ["promtool", "test", "rules", "alerts_test.yml"]):
        result = subprocess.run(command, cwd=GRAFANA, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_prometheus_loaded_the_alert_rules(prometheus):
    rules = httpx.get(f"{prometheus.url}/api/v1/rules", timeout=30).json()["data"]["groups"]
    names = {rule["name"] for group in rules for rule in group["rules"]}
    assert names == {"ProbserveModelDown", "ProbserveServerErrors", "ProbserveOverloaded",
                     "ProbserveSlowFirstByte", "ProbserveKVCacheFull"}


def test_the_operations_guide_lists_every_metric_and_panel():
    guide = (GRAFANA.parent / "docs" / "operations.md").read_text()
    for metric in METRICS:
        assert f"| `{metric.name}` |" in guide, metric.name
    for panel in PANELS:
        assert f"| {panel.title} |" in guide, panel.title
