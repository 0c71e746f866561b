"""The service's Prometheus metrics: every definition in one place, recorded by the three
deployments through Ray Serve's metrics API.

Each Ray node's metrics agent exports what the processes on that node record, so every
replica's numbers are scraped wherever it runs, with the `deployment`, `replica` and
`application` labels Serve adds. Ray prefixes every name with `ray_`; the scrape configuration
shipped with probserve (`grafana/prometheus.yml`, the Kubernetes PodMonitor) renames
`ray_probserve_*` back to `probserve_*` and vLLM's engine metrics (`ray_vllm_*`, recorded by
vLLM's own Ray stat logger) back to vLLM's `vllm:*` names. Counters get `_total` on export.
"""

import functools
import logging
import threading
import time
from dataclasses import dataclass

from serve_app.observe.request_log import RequestRecord, request_logger

SECONDS_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300]
TOKENS_PER_SECOND_BUCKETS = [10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000,
                             100000, 250000]


@dataclass(frozen=True)
class Metric:
    name: str  # as scraped through probserve's configuration
    kind: str  # counter, gauge or histogram
    tags: tuple[str, ...]
    help: str


REQUEST_TAGS = ("endpoint", "model", "status")
TENANT_TAGS = ("endpoint", "model", "tenant")
# A model replica's requests by model and LoRA adapter (empty: the base model).
ENGINE_TAGS = ("model", "adapter")
METRICS = [
    # Ingress: one observation per HTTP request (serve_app.observe.request_log.RequestRecord).
    Metric("probserve_requests_total", "counter", (*REQUEST_TAGS, "code", "tenant"),
           "HTTP requests by endpoint, model, status, error code (empty on success) and tenant"),
    Metric("probserve_request_duration_seconds", "histogram", REQUEST_TAGS,
           "Time from the request's arrival at the ingress to its response's last byte"),
    Metric("probserve_time_to_first_byte_seconds", "histogram", REQUEST_TAGS,
           "Time from the request's arrival at the ingress to its response's first byte"),
    Metric("probserve_request_queue_time_seconds", "histogram", REQUEST_TAGS,
           "Time a request waited before its engine scheduled it: to reach a model replica, "
           "then in the engine's queue"),
    Metric("probserve_request_prompt_tokens_total", "counter", TENANT_TAGS,
           "Prompt tokens of the requests the ingress admitted (the responses' usage.prompt_tokens)"),
    Metric("probserve_scored_tokens_total", "counter", TENANT_TAGS,
           "Prompt tokens whose log-probabilities were asked for (echo, spans, prompt_logprobs)"),
    Metric("probserve_completion_tokens_total", "counter", TENANT_TAGS,
           "Generated tokens returned to clients (the responses' usage.completion_tokens)"),
    Metric("probserve_full_vocab_sent_bytes_total", "counter", TENANT_TAGS,
           "Full-vocabulary bytes the ingress sent to clients, as compressed"),
    Metric("probserve_requests_in_flight", "gauge", (),
           "Requests an ingress replica is answering now"),
    Metric("probserve_full_vocab_waiting", "gauge", (),
           "Full-vocabulary requests waiting for one of an ingress replica's slots"),
    # Model replicas: one observation per engine request (a prompt).
    Metric("probserve_prompt_tokens_total", "counter", ENGINE_TAGS,
           "Prompt tokens of the engine requests a model replica served"),
    Metric("probserve_prefill_tokens_total", "counter", ENGINE_TAGS,
           "Prompt tokens the engine computed (prompt tokens less those found in its prefix cache)"),
    Metric("probserve_prefix_cache_read_tokens_total", "counter", ENGINE_TAGS,
           "Prompt tokens the engine read from its prefix cache instead of computing them"),
    Metric("probserve_scored_positions_total", "counter", ("model", "source"),
           "Prompt rows of requests the scored-prefix cache takes (echo, prompt_logprobs up to its "
           "top-k), by source: cache (served from it) or engine (computed)"),
    Metric("probserve_scored_cache_bytes", "gauge", ("model",),
           "Bytes a model replica's scored-prefix cache holds"),
    Metric("probserve_generation_tokens_total", "counter", ENGINE_TAGS,
           "Tokens the engine generated"),
    Metric("probserve_request_prefill_tokens_per_second", "histogram", ENGINE_TAGS,
           "Each engine request's prefill throughput: computed prompt tokens over prefill time"),
    Metric("probserve_request_prefill_time_seconds", "histogram", ENGINE_TAGS,
           "Time from an engine request's scheduling to its first token (its prefill)"),
    # Serializer pool: one observation per chunk of full-vocabulary positions.
    Metric("probserve_full_vocab_rows_total", "counter", ("model", "form"),
           "Full-vocabulary positions written (form: json or npy)"),
    Metric("probserve_full_vocab_bytes_total", "counter", ("model", "form"),
           "Full-vocabulary bytes written, before compression"),
    Metric("probserve_full_vocab_encoded_bytes_total", "counter", ("model", "form", "encoding"),
           "Full-vocabulary bytes as sent (encoding: gzip or identity)"),
    Metric("probserve_serializer_chunks_in_progress", "gauge", (),
           "Chunks a serializer pool worker holds: being written or waiting for its thread"),
    # Batch runner: one observation per batch line; the batches by status every few seconds.
    Metric("probserve_batch_lines_total", "counter", ("endpoint", "outcome"),
           "Batch lines finished, by outcome: completed (in the output file) or failed (in the "
           "error file)"),
    Metric("probserve_batch_prompt_tokens_total", "counter", ("endpoint",),
           "Prompt tokens of the batch lines answered"),
    Metric("probserve_batches", "gauge", ("status",),
           "Batches in storage by status (validating, in_progress, finalizing, cancelling, "
           "completed, failed, cancelled, expired)"),
]
BY_NAME = {metric.name: metric for metric in METRICS}


def ray_name(metric: Metric) -> str:
    """The name Ray's metrics API takes: without `_total`, which the exporter adds."""
    return metric.name.removesuffix("_total") if metric.kind == "counter" else metric.name


def recorder(name: str):
    """The Ray Serve metric object of one definition (in a Serve replica's process)."""
    from ray.serve import metrics

    metric = BY_NAME[name]
    kinds = {"counter": metrics.Counter, "gauge": metrics.Gauge}
    if metric.kind == "histogram":
        buckets = TOKENS_PER_SECOND_BUCKETS if name.endswith("per_second") else SECONDS_BUCKETS
        return metrics.Histogram(ray_name(metric), metric.help, boundaries=buckets,
                                 tag_keys=metric.tags)
    return kinds[metric.kind](ray_name(metric), metric.help, tag_keys=metric.tags)


def report_interval_s() -> float:
    """How often a process's metrics reach its node's agent: Ray's report interval, never less
    than 1 s (the floor Ray's own recorder applies when it ages gauges out)."""
    import ray

    return max(ray._config.metrics_report_interval_ms(), 1000) / 1000


def ray_connected() -> bool:
    import ray

    return ray.is_initialized()


class HeldGauges:
    """Gauges set again every report interval with their last values. A Ray process exports a
    gauge only in the intervals it was set in, and the agent drops a series not reported for
    two: a gauge set only when its value changes (an idle replica's zero, an idle engine's last
    step) would vanish from Prometheus within seconds. One daemon thread a process sets them,
    so that it works wherever they are set: on an event loop or in vLLM's threads. It stops
    once the process has left Ray: a call into Ray after `ray.shutdown` ends the process."""

    def __init__(self, period_s=report_interval_s, connected=ray_connected):
        self.period_s, self.connected = period_s, connected
        self.held: dict[tuple, tuple] = {}
        self.lock = threading.Lock()
        self.refresher: threading.Thread | None = None

    def set(self, gauge, value: float, tags: dict[str, str]) -> None:
        with self.lock:  # a refresh never sets a value older than this one after it
            gauge.set(value, tags)
            self.held[id(gauge), tuple(sorted(tags.items()))] = (gauge, value, tags)
            if self.refresher is None:
                self.refresher = threading.Thread(target=self.refresh, args=(self.period_s(),),
                                                  name="held-gauges", daemon=True)
                self.refresher.start()

    def refresh(self, period_s: float) -> None:
        while True:
            time.sleep(period_s)
            with self.lock:
                if not self.connected():
                    self.held.clear()
                    self.refresher = None
                    return
                for gauge, value, tags in self.held.values():
                    gauge.set(value, tags)


HELD_GAUGES = HeldGauges()


class HeldGauge:
    """A gauge of a count its holder changes (requests in flight, chunks held), exported for as
    long as the process lives once it has been set."""

    def __init__(self, name: str, tags: dict[str, str] | None = None):
        self.gauge, self.tags = recorder(name), tags or {}
        self.value = 0

    def change(self, by: int) -> None:
        self.set(self.value + by)

    def set(self, value: int) -> None:
        self.value = value
        HELD_GAUGES.set(self.gauge, value, self.tags)


class IngressMetrics:
    def __init__(self):
        self.requests = recorder("probserve_requests_total")
        self.duration = recorder("probserve_request_duration_seconds")
        self.first_byte = recorder("probserve_time_to_first_byte_seconds")
        self.queue_time = recorder("probserve_request_queue_time_seconds")
        self.prompt = recorder("probserve_request_prompt_tokens_total")
        self.scored = recorder("probserve_scored_tokens_total")
        self.completion = recorder("probserve_completion_tokens_total")
        self.full_vocab_sent = recorder("probserve_full_vocab_sent_bytes_total")
        self.in_flight = HeldGauge("probserve_requests_in_flight")

    def started(self, record: RequestRecord) -> None:
        self.in_flight.change(1)

    def finished(self, record: RequestRecord) -> None:
        self.in_flight.change(-1)
        tags = {"endpoint": record.endpoint, "model": record.model, "status": str(record.status)}
        self.requests.inc(1, {**tags, "code": record.code, "tenant": record.tenant})
        self.duration.observe(record.duration_s, tags)
        if record.time_to_first_byte_s is not None:
            self.first_byte.observe(record.time_to_first_byte_s, tags)
        if record.queue_time_s is not None:
            self.queue_time.observe(record.queue_time_s, tags)
        tokens = {"endpoint": record.endpoint, "model": record.model, "tenant": record.tenant}
        for counter, value in [(self.prompt, record.prompt_tokens), (self.scored, record.scored_tokens),
                               (self.completion, record.generated_tokens),
                               (self.full_vocab_sent, record.full_vocab_bytes)]:
            if value and record.served():
                counter.inc(value, tokens)


class RequestObserver:
    """Each request into the ingress's metrics and the request log, both made on first use:
    in the Ingress replica's process, whose metrics Ray exports and whose stderr it keeps."""

    @functools.cached_property
    def metrics(self) -> IngressMetrics:
        return IngressMetrics()

    @functools.cached_property
    def log(self) -> logging.Logger:
        return request_logger()

    def started(self, record: RequestRecord) -> None:
        self.metrics.started(record)

    def finished(self, record: RequestRecord) -> None:
        self.metrics.finished(record)
        self.log.info(record.log_line().decode())


@dataclass(frozen=True)
class EngineRequestStats:
    """What one engine request cost, from vLLM's per-request statistics."""

    prompt_tokens: int
    cached_tokens: int
    generated_tokens: int
    prefill_time_s: float | None  # None when the engine recorded no first token


class ReplicaMetrics:
    def __init__(self, model: str):
        self.tags = {"model": model}
        self.prompt = recorder("probserve_prompt_tokens_total")
        self.prefill = recorder("probserve_prefill_tokens_total")
        self.cache_read = recorder("probserve_prefix_cache_read_tokens_total")
        self.scored_positions = recorder("probserve_scored_positions_total")
        self.scored_bytes = HeldGauge("probserve_scored_cache_bytes", tags=self.tags)
        self.generation = recorder("probserve_generation_tokens_total")
        self.prefill_rate = recorder("probserve_request_prefill_tokens_per_second")
        self.prefill_time = recorder("probserve_request_prefill_time_seconds")

    def served(self, stats: EngineRequestStats, adapter: str) -> None:
        """One engine request's counts, on `adapter` (empty: the base model)."""
        tags = {**self.tags, "adapter": adapter}
        computed = stats.prompt_tokens - stats.cached_tokens
        self.prompt.inc(stats.prompt_tokens, tags)
        if computed:
            self.prefill.inc(computed, tags)
        if stats.cached_tokens:
            self.cache_read.inc(stats.cached_tokens, tags)
        if stats.generated_tokens:
            self.generation.inc(stats.generated_tokens, tags)
        if stats.prefill_time_s is not None and stats.prefill_time_s > 0:
            self.prefill_time.observe(stats.prefill_time_s, tags)
            self.prefill_rate.observe(computed / stats.prefill_time_s, tags)


    def scored(self, from_cache: int, from_engine: int, cache_bytes: int) -> None:
        for source, positions in (("cache", from_cache), ("engine", from_engine)):
            if positions:  # Ray's counters take positive increments only
                self.scored_positions.inc(positions, {**self.tags, "source": source})
        self.scored_bytes.set(cache_bytes)


class PoolMetrics:
    def __init__(self):
        self.rows = recorder("probserve_full_vocab_rows_total")
        self.written = recorder("probserve_full_vocab_bytes_total")
        self.sent = recorder("probserve_full_vocab_encoded_bytes_total")
        self.in_progress = HeldGauge("probserve_serializer_chunks_in_progress")

    def wrote(self, model: str, form: str, rows: int, written: int, sent: int, encoding: str) -> None:
        tags = {"model": model, "form": form}
        self.rows.inc(rows, tags)
        self.written.inc(written, tags)
        self.sent.inc(sent, {**tags, "encoding": encoding})


class BatchMetrics:
    def __init__(self):
        self.lines = recorder("probserve_batch_lines_total")
        self.tokens = recorder("probserve_batch_prompt_tokens_total")
        self.batches = recorder("probserve_batches")

    def line(self, endpoint: str, outcome: str, prompt_tokens: int) -> None:
        self.lines.inc(1, {"endpoint": endpoint, "outcome": outcome})
        if prompt_tokens:
            self.tokens.inc(prompt_tokens, {"endpoint": endpoint})

    def counted(self, batches: dict[str, int]) -> None:
        """The batches by status, zeros included (the runner's health check)."""
        for status, count in batches.items():
            HELD_GAUGES.set(self.batches, count, {"status": status})
