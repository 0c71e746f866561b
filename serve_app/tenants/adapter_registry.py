"""The LoRA adapters tenants load at run time (POST /v1/load_lora_adapter): which exist, whose
each is, on which model, from which folder, and whether requests for one are in flight.

Kept where the rate limits are (`tenancy.storage`): in Redis every ingress replica sees the
same adapters, and they outlive every replica; in memory, this ingress replica's alone. A model
replica holds none of it: each request carries its adapter's folder, and the replica that gets
it loads the adapter on first use, so the registry reaches a restarted or added replica
unasked.

A request in flight holds a lease on its adapter (unloading it meanwhile is refused), which
ends with the response, or after LEASE_S where its ingress replica died before it could end it.
"""

import time
import uuid
from collections import defaultdict
from dataclasses import asdict, dataclass

import orjson

from serve_app.tenants.redis_client import redis_client

KEY_PREFIX = "probserve:adapters"
LEASE_S = 3600  # longer than any request; a lease its ingress replica lost ends by itself


@dataclass(frozen=True)
class LoadedAdapter:
    name: str
    model: str  # the base model's name
    tenant: str
    path: str
    created: int  # Unix seconds
    # A new one at every load: a name loaded again (load_inplace) gets caches and an engine
    # slot of its own, even from the same folder.
    revision: str

    @classmethod
    def new(cls, name: str, model: str, tenant: str, path: str) -> "LoadedAdapter":
        return cls(name, model, tenant, path, int(time.time()), uuid.uuid4().hex[:12])

    def dumps(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def loads(cls, stored: bytes | str) -> "LoadedAdapter":
        return cls(**orjson.loads(stored))


class MemoryRegistry:
    def __init__(self, clock=time.time):
        self.adapters: dict[str, LoadedAdapter] = {}
        self.leases: dict[str, dict[str, float]] = defaultdict(dict)
        self.clock = clock

    async def add(self, adapter: LoadedAdapter, replace: bool) -> bool:
        """Stored; False where the name is taken and not to be replaced."""
        if adapter.name in self.adapters and not replace:
            return False
        self.adapters[adapter.name] = adapter
        return True

    async def get(self, name: str) -> LoadedAdapter | None:
        return self.adapters.get(name)

    async def all(self) -> list[LoadedAdapter]:
        return list(self.adapters.values())

    async def remove(self, name: str) -> None:
        self.adapters.pop(name, None)
        self.leases.pop(name, None)

    async def lease(self, name: str, request_id: str) -> None:
        self.leases[name][request_id] = self.clock() + LEASE_S

    async def release(self, name: str, request_id: str) -> None:
        self.leases[name].pop(request_id, None)

    async def leased(self, name: str) -> int:
        now = self.clock()
        held = self.leases[name] = {id_: end for id_, end in self.leases[name].items() if end > now}
        return len(held)


class RedisRegistry:
    """One hash of every adapter (name to record), and a sorted set of leases per adapter
    (request id scored by the lease's end)."""

    def __init__(self, url: str, clock=time.time):
        self.redis, self.clock = redis_client(url), clock

    async def add(self, adapter: LoadedAdapter, replace: bool) -> bool:
        if replace:
            await self.redis.hset(KEY_PREFIX, adapter.name, adapter.dumps())
            return True
        return bool(await self.redis.hsetnx(KEY_PREFIX, adapter.name, adapter.dumps()))

    async def get(self, name: str) -> LoadedAdapter | None:
        stored = await self.redis.hget(KEY_PREFIX, name)
        return LoadedAdapter.loads(stored) if stored else None

    async def all(self) -> list[LoadedAdapter]:
        return [LoadedAdapter.loads(stored) for stored in (await self.redis.hgetall(KEY_PREFIX)).values()]

    async def remove(self, name: str) -> None:
        await self.redis.hdel(KEY_PREFIX, name)
        await self.redis.delete(self.leases_key(name))

    def leases_key(self, name: str) -> str:
        return f"{KEY_PREFIX}:leases:{name}"

    async def lease(self, name: str, request_id: str) -> None:
        await self.redis.zadd(self.leases_key(name), {request_id: self.clock() + LEASE_S})

    async def release(self, name: str, request_id: str) -> None:
        await self.redis.zrem(self.leases_key(name), request_id)

    async def leased(self, name: str) -> int:
        key = self.leases_key(name)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.zremrangebyscore(key, "-inf", self.clock())
            pipe.zcard(key)
            _, held = await pipe.execute()
        return held


def adapter_registry(storage: str) -> MemoryRegistry | RedisRegistry:
    return RedisRegistry(storage) if storage.startswith("redis://") else MemoryRegistry()
