"""What a request's `model` may name: the configured models and adapters a tenant may use,
and the LoRA adapters the tenant loaded at run time (POST /v1/load_lora_adapter, kept in
serve_app.tenants.adapter_registry), which are its own: another tenant is told they do not
exist, as for a model it may not use.

An adapter is loaded by checking it, never by a replica: its folder within the service's
adapter roots (and the tenant's), its files a LoRA adapter that fits its base model as served
(serve_app.adapters), the tenant within its `max_adapters`. Each replica loads it into its
engine on its first request for it.
"""

import asyncio
import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from serve_app.adapters import AdapterProblem, check_adapter
from serve_app.api.request_models import LoadAdapterRequest, UnloadAdapterRequest
from serve_app.config import AdapterConfig, AppConfig, ModelConfig, Served
from serve_app.errors import APIError, invalid
from serve_app.tenants.adapter_registry import LoadedAdapter, adapter_registry
from serve_app.tenants.keyring import Tenant

logger = logging.getLogger("probserve.adapters")


def within(folder: str, roots: list[Path]) -> bool:
    """Whether `folder` lies in one of `roots` (or is one), as written: `..` cannot leave a root."""
    path = os.path.normpath(folder)
    return os.path.isabs(path) and any(
        os.path.commonpath([path, os.path.normpath(root)]) == os.path.normpath(root) for root in roots)


def allowed_folder(folder: str, roots: list[Path]) -> Path:
    """The folder (a relative path: in the first root), if it lies in a root both as written
    and with its links followed; else 400 `adapter_path_not_allowed`, having read nothing in it."""
    path = os.path.join(roots[0], folder) if roots and not os.path.isabs(folder) else folder
    if within(path, roots) and within(str(Path(path).resolve()), [r.resolve() for r in roots]):
        return Path(path)
    shown = ", ".join(map(str, roots)) or "none"
    raise invalid("lora_path", "lora_path must be a folder under one of the adapter roots you may "
                  f"load from (a relative path is taken from the first): {shown}", "adapter_path_not_allowed")


def loaded_served(loaded: LoadedAdapter, model: ModelConfig) -> Served:
    return Served(model, AdapterConfig(name=loaded.name, path=loaded.path), loaded.tenant,
                  loaded.revision, loaded.created)


def not_found(name: str, param: str, known: list[Served]) -> APIError:
    return APIError(404, "model_not_found", f"model {name!r} does not exist; this service has: "
                    f"{', '.join(s.name for s in known) or 'none'}", param)


class Catalog:
    def __init__(self, config: AppConfig, retry_after_s: int, spawn: Callable[[Awaitable], None]):
        """spawn: runs a coroutine to its end in the background (Access.spawn)."""
        self.config, self.retry_after_s, self.spawn = config, retry_after_s, spawn
        self.registry = adapter_registry(config.tenancy.storage)
        self.roots = config.tenancy.resolved_adapter_roots()

    async def stored(self, call: Awaitable):
        """The registry's answer, else 503 `adapter_registry_unavailable`."""
        try:
            return await call
        except Exception as error:
            raise APIError(503, "adapter_registry_unavailable", "the storage of loaded adapters "
                           f"cannot be reached: {type(error).__name__}: {error}",
                           headers={"Retry-After": str(self.retry_after_s)}) from None

    async def find(self, name: str, owner: str, tenant: Tenant) -> Served | None:
        """What `name` is for this tenant (`owner`: its name), or None."""
        served = self.config.served(name)
        if served is None:
            loaded = await self.stored(self.registry.get(name))
            model = loaded and loaded.tenant == owner and self.config.model(loaded.model)
            served = loaded_served(loaded, model) if model else None
        return served if served and tenant.allows(served.model.name) else None

    async def served(self, name: str, owner: str, tenant: Tenant, param: str = "model") -> Served:
        """As `find`, else 404 naming only what the tenant may use."""
        served = await self.find(name, owner, tenant)
        if served is None:
            raise await self.not_found(name, owner, tenant, param)
        return served

    async def not_found(self, name: str, owner: str, tenant: Tenant, param: str = "model") -> APIError:
        return not_found(name, param, await self.listed(owner, tenant))

    async def listed(self, owner: str, tenant: Tenant) -> list[Served]:
        """The models and adapters the tenant may use, its loaded adapters after the rest."""
        loaded = [loaded_served(a, model) for a in await self.stored(self.registry.all())
                  if a.tenant == owner and (model := self.config.model(a.model))]
        return [s for s in [*self.config.served_models(), *sorted(loaded, key=lambda s: s.name)]
                if tenant.allows(s.model.name)]

    async def load(self, owner: str, tenant: Tenant, body: LoadAdapterRequest) -> Served:
        model = await self.base_model(owner, tenant, body.base_model)
        folder = allowed_folder(body.lora_path, self.tenant_roots(tenant))
        replaced = await self.check_name_free(body.lora_name, owner, body.load_inplace)
        await self.check_room(owner, tenant, replaced)
        try:
            await asyncio.to_thread(check_adapter, folder, body.lora_name, model)
        except AdapterProblem as problem:
            raise invalid("lora_path", str(problem), problem.code) from None
        loaded = LoadedAdapter.new(body.lora_name, model.name, owner, str(folder))
        if not await self.stored(self.registry.add(loaded, replace=replaced)):
            raise name_taken(body.lora_name)
        return loaded_served(loaded, model)

    async def unload(self, owner: str, tenant: Tenant, body: UnloadAdapterRequest) -> None:
        name = body.lora_name
        if self.config.served(name) is not None:
            raise APIError(409, "adapter_configured", f"{name!r} is in the service's configuration: "
                           "only adapters loaded with POST /v1/load_lora_adapter are unloaded", "lora_name")
        await self.served(name, owner, tenant, "lora_name")
        if await self.stored(self.registry.leased(name)):
            raise APIError(409, "adapter_in_use", f"adapter {name!r} has requests in flight: "
                           "unload it once they are answered", "lora_name",
                           headers={"Retry-After": str(self.retry_after_s)})
        await self.stored(self.registry.remove(name))

    async def base_model(self, owner: str, tenant: Tenant, name: str | None) -> ModelConfig:
        """The model an adapter is loaded on: the one named, else the tenant's only model
        that serves LoRA."""
        if name is not None:
            served = await self.served(name, owner, tenant, "base_model")
            if served.adapter is not None or served.model.lora is None:
                raise invalid("base_model", f"{name!r} serves no LoRA adapters: the models that "
                              f"do are {', '.join(self.lora_models(tenant)) or 'none'}", "lora_not_enabled")
            return served.model
        names = self.lora_models(tenant)
        if len(names) != 1:
            raise invalid("base_model", f"base_model is required: {len(names)} models serve LoRA "
                          f"adapters ({', '.join(names) or 'none'})",
                          "invalid_request" if names else "lora_not_enabled")
        return self.config.model(names[0])

    def lora_models(self, tenant: Tenant) -> list[str]:
        return [m.name for m in self.config.models if m.lora and tenant.allows(m.name)]

    def tenant_roots(self, tenant: Tenant) -> list[Path]:
        """The service's adapter roots, narrowed to the tenant's own where it has some."""
        own = tenant.limits.adapter_roots
        if own is None:
            return self.roots
        return [Path(root) for root in own if within(root, self.roots)]

    async def check_name_free(self, name: str, owner: str, replace: bool) -> bool:
        """Whether loading `name` replaces the tenant's own adapter; 409 where the name is
        another's, or the tenant's own and not to be replaced."""
        loaded = await self.stored(self.registry.get(name))
        if self.config.served(name) is not None or (loaded and (loaded.tenant != owner or not replace)):
            raise name_taken(name)
        return loaded is not None

    async def check_room(self, owner: str, tenant: Tenant, replacing: bool) -> None:
        bound = tenant.limits.max_adapters
        if bound is None or replacing:
            return
        held = sum(a.tenant == owner for a in await self.stored(self.registry.all()))
        if held >= bound:
            raise invalid("lora_name", f"you hold {held} loaded adapters, your limit "
                          f"(max_adapters {bound}): unload one first", "adapter_limit_reached")

    async def lease(self, served: Served) -> Callable[[], None]:
        """For a request on a loaded adapter: its lease, and the lease's release."""
        if served.owner is None:
            return lambda: None
        name, request = served.name, uuid.uuid4().hex
        await self.stored(self.registry.lease(name, request))

        return lambda: self.spawn(self.release(name, request))

    async def release(self, name: str, request: str) -> None:
        try:
            await self.registry.release(name, request)
        except Exception as error:  # the lease ends by itself (LEASE_S)
            logger.error("lease of adapter %r not released (storage: %s): %s", name,
                         type(error).__name__, error)


def name_taken(name: str) -> APIError:
    return APIError(409, "adapter_name_taken", f"the model name {name!r} is taken: choose another "
                    "(or, for your own adapter, load it again with load_inplace)", "lora_name")
