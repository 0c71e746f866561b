"""Observability: Prometheus metrics of every process, the record and log line of each request,
request ids, and which models have a running replica. Imports `config` at most."""
