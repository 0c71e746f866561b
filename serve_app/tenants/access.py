"""What the ingress settles before any model work: whose request it is, what that tenant may
use, and whether it fits the tenant's limits; and, once the response is over, what it used."""

import asyncio
import logging
from pathlib import Path

from limits.storage import storage_from_string

from serve_app.config import TenancyConfig
from serve_app.errors import APIError
from serve_app.observe.request_log import RequestRecord
from serve_app.tenants.keyring import ANONYMOUS, UNLIMITED, Keyring, Tenant, WatchedKeyring
from serve_app.tenants.quotas import RateLimits, TenantQueues, request_tokens
from serve_app.tenants.redis_client import redis_options
from serve_app.tenants.usage import MemoryUsage, RedisUsage, counts

logger = logging.getLogger("probserve.access")


def limits_storage(url: str):
    """The `limits` library's asyncio storage for the configured URL (redis-py's client)."""
    if url.startswith("redis://"):
        return storage_from_string(f"async+{url}", implementation="redispy", **redis_options())
    return storage_from_string("async+memory://")


class Access:
    def __init__(self, config: TenancyConfig, retry_after_s: int):
        self.keyring = (WatchedKeyring(Path(config.key_file), Path(config.secret_file), config.reload_s,
                                       report=logger.warning)
                        if config.key_file else None)
        self.rates = RateLimits(limits_storage(config.storage), config.on_storage_failure, retry_after_s)
        self.requests = TenantQueues("requests")
        self.full_vocab = TenantQueues("full-vocabulary requests")
        self.usage = RedisUsage(config.storage) if config.storage.startswith("redis://") else MemoryUsage()
        self.pending: set[asyncio.Task] = set()
        self.retry_after_s = retry_after_s

    async def admit(self, authorization: str | None, record: RequestRecord) -> Tenant:
        """The request's tenant (401 without a valid key), counted against its requests per
        minute and given a place in flight, waiting in the tenant's queue if need be (429
        beyond). The place is released, the usage counted and the generated tokens charged when
        the response is over."""
        keyring = self.keyring.current() if self.keyring else None  # one version for both
        name = keyring.tenant(authorization) if keyring else ANONYMOUS
        return await self.admit_tenant(name, keyring, record)

    async def admit_named(self, name: str, record: RequestRecord) -> Tenant:
        """A batch line's tenant, named when its batch was created, admitted as its own
        requests are (its limits bound its batches too); 403 once the key file no longer has it."""
        keyring = self.keyring.current() if self.keyring else None
        if keyring and name not in keyring.tenants:
            raise APIError(403, "tenant_removed", f"tenant {name!r} is no longer in the key file")
        return await self.admit_tenant(name, keyring, record)

    async def admit_tenant(self, name: str, keyring: Keyring | None, record: RequestRecord) -> Tenant:
        record.tenant = name
        tenant = keyring.tenants[name] if keyring else UNLIMITED
        record.on_finish.append(lambda: self.account(tenant, record))  # refusals count too
        limits = tenant.limits
        record.response_headers.update(
            await self.rates.charge(name, "requests", limits.requests_per_minute, 1, "requests"))
        record.on_finish.append(await self.requests.enter(name, limits.max_in_flight, limits.max_waiting,
                                                          limits.max_wait_s))
        return tenant

    async def full_vocab_place(self, tenant: Tenant, record: RequestRecord):
        """A place among the tenant's full-vocabulary requests; returns its release."""
        limits = tenant.limits
        return await self.full_vocab.enter(record.tenant, limits.max_full_vocab_in_flight,
                                           limits.max_waiting, limits.max_wait_s)

    async def charge_prompt(self, tenant: Tenant, record: RequestRecord, full_vocab_positions: int) -> None:
        """The prompt's tokens (full-vocabulary positions weighted) against tokens per minute."""
        cost = request_tokens(record.prompt_tokens, full_vocab_positions, tenant.limits)
        record.response_headers.update(await self.rates.charge(
            record.tenant, "tokens", tenant.limits.tokens_per_minute, cost, "this request's prompt tokens"))

    async def stored_usage(self, tenant: str) -> dict:
        """The tenant's usage as stored (serve_app.tenants.usage), else 503 `usage_unavailable`."""
        try:
            return await self.usage.read(tenant)
        except Exception as error:
            raise APIError(503, "usage_unavailable", f"the usage storage cannot be reached: {error}",
                           headers={"Retry-After": str(self.retry_after_s)}) from None

    def account(self, tenant: Tenant, record: RequestRecord) -> None:
        self.spawn(self.rates.add_after(record.tenant, tenant.limits.tokens_per_minute,
                                        record.generated_tokens))
        self.spawn(self.add_usage(record))

    async def add_usage(self, record: RequestRecord) -> None:
        try:
            await self.usage.add(record.tenant, counts(record))
        except Exception as error:
            logger.error("usage of tenant %r not counted (storage: %s): %s", record.tenant,
                         type(error).__name__, error)

    def spawn(self, work) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)
