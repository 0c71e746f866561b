"""Each tenant's usage, for GET /v1/usage: requests by status, prompt, scored and generated
tokens, full-vocabulary bytes sent. Kept in Redis when the rate limits are (every ingress
replica adds to the same figures), else in this ingress replica's memory, since it started."""

from collections import Counter, defaultdict

from serve_app.observe.request_log import RequestRecord
from serve_app.tenants.redis_client import redis_client

KEY_PREFIX = "probserve:usage:"
TOKEN_FIELDS = ("prompt_tokens", "scored_tokens", "generated_tokens", "full_vocab_bytes")


def counts(record: RequestRecord) -> dict[str, int]:
    """What one request adds to its tenant's usage: its tokens if it was served."""
    added = {field: getattr(record, field) for field in TOKEN_FIELDS
             if getattr(record, field) and record.served()}
    return {f"requests_{record.status}": 1, **added}


def usage_body(tenant: str, stored: dict[str, int]) -> dict:
    requests = {field.removeprefix("requests_"): value for field, value in sorted(stored.items())
                if field.startswith("requests_")}
    return {"object": "usage", "tenant": tenant, "requests": requests,
            **{field: stored.get(field, 0) for field in TOKEN_FIELDS}}


class MemoryUsage:
    def __init__(self):
        self.by_tenant: dict[str, Counter] = defaultdict(Counter)

    async def add(self, tenant: str, added: dict[str, int]) -> None:
        self.by_tenant[tenant].update(added)

    async def read(self, tenant: str) -> dict[str, int]:
        return dict(self.by_tenant[tenant])


class RedisUsage:
    def __init__(self, url: str):
        self.redis = redis_client(url)

    async def add(self, tenant: str, added: dict[str, int]) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            for field, value in added.items():
                pipe.hincrby(KEY_PREFIX + tenant, field, value)
            await pipe.execute()

    async def read(self, tenant: str) -> dict[str, int]:
        stored = await self.redis.hgetall(KEY_PREFIX + tenant)
        return {field.decode(): int(value) for field, value in stored.items()}
