"""Tenants: API keys, per-tenant limits (rates, in-flight places and queues), usage, and the
ingress's one call into them (`access`). Imports `config`, `errors`, `gate`, `observe`."""
