"""The Redis client options of every tenancy store (rate limits, usage, loaded adapters).

One more try on a fresh connection: after Redis restarts, each pooled connection fails its
next command ("Connection closed by server"), and without it a request would be refused with
503 for a Redis that is back. Two seconds at most per try, so that a Redis that is gone is
answered within four."""

from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

TIMEOUTS = {"socket_timeout": 2, "socket_connect_timeout": 2}


def redis_options() -> dict:
    return {**TIMEOUTS, "retry": Retry(NoBackoff(), 1)}


def redis_client(url: str):
    import redis.asyncio

    return redis.asyncio.from_url(url, **redis_options())
