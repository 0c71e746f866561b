"""The Grafana dashboard over probserve's metrics (serve_app.observe.metrics), built from the panel list
below: `python -m serve_app.ops.dashboard` writes `grafana/probserve.json`, which a test keeps equal
to this list and whose every query it runs against a real Prometheus.
"""

import sys
from dataclasses import dataclass
from pathlib import Path

import orjson

DASHBOARD_FILE = Path(__file__).resolve().parents[2] / "grafana" / "probserve.json"
MODEL = 'model=~"$model"'
RATE = "$__rate_interval"


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str  # Grafana's unit id
    queries: tuple[tuple[str, str], ...]  # (PromQL, legend)
    description: str


def quantiles(metric: str, by: str, selector: str = MODEL) -> tuple[tuple[str, str], ...]:
    return tuple((f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{{{selector}}}[{RATE}])))",
                  f"p{round(q * 100)} {{{{{by}}}}}") for q in (0.5, 0.9, 0.99))


PANELS = [
    Panel("Prefill throughput", "short",
          ((f"sum by (model) (rate(probserve_prefill_tokens_total{{{MODEL}}}[{RATE}]))", "{{model}}"),),
          "Prompt tokens computed per second by each model's engines (cached prefixes excluded)."),
    Panel("Prefill throughput per replica", "short",
          ((f"sum by (model, replica) (rate(probserve_prefill_tokens_total{{{MODEL}}}[{RATE}]))",
            "{{replica}}"),),
          "The same per model replica: an uneven split points at routing or a slow node."),
    Panel("Per-request prefill rate", "short",
          quantiles("probserve_request_prefill_tokens_per_second", "model"),
          "Each request's computed prompt tokens over its prefill time: falls when batches are "
          "crowded or the engine preempts."),
    Panel("Tokens", "short",
          ((f"sum by (model) (rate(probserve_prompt_tokens_total{{{MODEL}}}[{RATE}]))", "prompt {{model}}"),
           (f"sum by (model) (rate(probserve_scored_tokens_total{{{MODEL}}}[{RATE}]))", "scored {{model}}"),
           (f"sum by (model) (rate(probserve_generation_tokens_total{{{MODEL}}}[{RATE}]))",
            "generated {{model}}")),
          "Prompt tokens received, prompt tokens scored (echo, spans, prompt_logprobs) and tokens "
          "generated, per second."),
    Panel("Prefix reuse", "short",
          ((f"sum by (model) (rate(probserve_prefix_cache_read_tokens_total{{{MODEL}}}[{RATE}]))",
            "KV cache reads {{model}}"),
           (f'sum by (model) (rate(probserve_scored_positions_total{{source="cache", {MODEL}}}[{RATE}]))',
            "scored rows served {{model}}")),
          "Prompt tokens read from the engines' prefix cache instead of computed, and prompt rows "
          "served from the scored-prefix cache, per second."),
    Panel("Scored-prefix cache", "percentunit",
          ((f'sum by (model) (rate(probserve_scored_positions_total{{source="cache", {MODEL}}}[{RATE}])) / '
            f"sum by (model) (rate(probserve_scored_positions_total{{{MODEL}}}[{RATE}]))",
            "hit ratio {{model}}"),),
          "Prompt rows the scored-prefix cache served over all it was asked for (echo and "
          "prompt_logprobs up to its top-k): low on traffic that shares no prefixes."),
    Panel("Scored-prefix cache size", "bytes",
          ((f"sum by (model) (probserve_scored_cache_bytes{{{MODEL}}})", "{{model}}"),),
          "Bytes the model replicas' scored-prefix caches hold, against `scored_cache.max_bytes` "
          "per replica."),
    Panel("Request latency", "s", quantiles("probserve_request_duration_seconds", "endpoint"),
          "Arrival at the ingress to the last byte, by endpoint."),
    Panel("Time to first byte", "s", quantiles("probserve_time_to_first_byte_seconds", "endpoint"),
          "Arrival at the ingress to the first byte of the response, by endpoint."),
    Panel("Queue time", "s", quantiles("probserve_request_queue_time_seconds", "model"),
          "Waiting before the engine scheduled the request: routing to a replica, then the "
          "engine's queue."),
    Panel("Requests by status", "reqps",
          ((f"sum by (status) (rate(probserve_requests_total[{RATE}]))", "{{status}}"),),
          "HTTP requests per second by status."),
    Panel("Errors by code", "reqps",
          ((f'sum by (code) (rate(probserve_requests_total{{code!=""}}[{RATE}]))', "{{code}}"),),
          "Refused and failed requests per second by their error code (docs/errors.md)."),
    Panel("In flight and waiting", "short",
          (("sum(probserve_requests_in_flight)", "in flight"),
           ("sum(probserve_full_vocab_waiting)", "waiting for a full-vocabulary slot"),
           ("sum(probserve_serializer_chunks_in_progress)", "serializer pool chunks")),
          "Requests the ingress replicas answer now, full-vocabulary requests waiting for a "
          "slot, and chunks the serializer pool holds."),
    Panel("Full-vocabulary bytes", "Bps",
          ((f"sum by (form) (rate(probserve_full_vocab_bytes_total{{{MODEL}}}[{RATE}]))", "written {{form}}"),
           (f"sum by (encoding) (rate(probserve_full_vocab_encoded_bytes_total{{{MODEL}}}[{RATE}]))",
            "sent {{encoding}}")),
          "Full-vocabulary bytes the serializer pool writes, and as sent after compression."),
    Panel("Full-vocabulary compression ratio", "none",
          ((f"sum(rate(probserve_full_vocab_bytes_total{{{MODEL}}}[{RATE}])) / "
            f"sum(rate(probserve_full_vocab_encoded_bytes_total{{{MODEL}}}[{RATE}]))", "written / sent"),),
          "Bytes written over bytes sent: about 4 with gzip, 1 for clients that take no gzip."),
    Panel("Engine requests", "short",
          (('sum by (model_name) (vllm:num_requests_running{model_name=~"$model"})',
            "running {{model_name}}"),
           ('sum by (model_name) (vllm:num_requests_waiting{model_name=~"$model"})',
            "waiting {{model_name}}")),
          "Requests vLLM's engines run and hold waiting."),
    Panel("KV cache use", "percentunit",
          (('max by (model_name) (vllm:kv_cache_usage_perc{model_name=~"$model"})', "{{model_name}}"),),
          "The fullest engine's KV cache, per model."),
    Panel("Batches", "short",
          (("sum by (status) (probserve_batches)", "{{status}}"),),
          "Batches by status: those in progress, and those kept in storage since they ended."),
    Panel("Batch throughput", "short",
          ((f"sum by (outcome) (rate(probserve_batch_lines_total[{RATE}]))", "lines {{outcome}}"),
           (f"sum(rate(probserve_batch_prompt_tokens_total[{RATE}]))", "prompt tokens")),
          "Batch lines finished per second (completed: in the output file; failed: in the error "
          "file) and the answered lines' prompt tokens per second."),
    Panel("Replicas", "short",
          (("sum by (deployment) (ray_serve_deployment_replica_healthy)", "healthy {{deployment}}"),
           ("sum by (deployment) (ray_serve_autoscaling_target_replicas)", "target {{deployment}}")),
          "Healthy replicas of each deployment (models, ingress, serializer pool) and the "
          "autoscaler's target."),
]
WIDTH, HEIGHT, COLUMNS = 12, 8, 2


def panel_json(panel: Panel, index: int) -> dict:
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": panel.title,
        "description": panel.description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"x": (index % COLUMNS) * WIDTH, "y": (index // COLUMNS) * HEIGHT,
                    "w": WIDTH, "h": HEIGHT},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
                     "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                    for i, (expr, legend) in enumerate(panel.queries)],
    }


def dashboard() -> dict:
    return {
        "uid": "probserve",
        "title": "probserve",
        "description": "Prefill throughput, tokens, latency, queueing, errors, full-vocabulary "
                       "bytes and replicas (docs/operations.md, Monitoring)",
        "schemaVersion": 39,
        "editable": True,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
            {"name": "model", "type": "query", "label": "Model", "multi": True, "includeAll": True,
             "allValue": ".*", "current": {"text": "All", "value": "$__all"},
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": {"query": "label_values(probserve_prompt_tokens_total, model)",
                       "refId": "models"}, "refresh": 2},
        ]},
        "panels": [panel_json(panel, i) for i, panel in enumerate(PANELS)],
    }


def dashboard_text() -> bytes:
    return orjson.dumps(dashboard(), option=orjson.OPT_INDENT_2) + b"\n"


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DASHBOARD_FILE
    target.write_bytes(dashboard_text())
    print(f"wrote {target}")
