"""LoRA adapters loaded at run time: a tenant's own (found, listed and unloaded by it alone),
from folders within the adapter roots only, within the tenant's limits, under names nobody
holds, and never unloaded while a request on one is in flight; the registry's leases."""

import json
import os

import pytest

from serve_app.api.request_models import LoadAdapterRequest, UnloadAdapterRequest
from serve_app.config import AppConfig
from serve_app.errors import APIError
from serve_app.front.catalog import Catalog, allowed_folder, within
from serve_app.store.adapter_store import StoreAdapter, build_adapter
from serve_app.tenants.adapter_registry import LEASE_S, LoadedAdapter, MemoryRegistry
from serve_app.tenants.keyring import Tenant, TenantLimits
from tests.unit.fakes import in_a_loop
from tests.unit.test_adapters import TINY

ANYONE = Tenant()


def test_a_folder_is_allowed_within_a_root_as_written_and_as_linked(tmp_path):
    """A relative path is taken from the first root."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "mine").mkdir(parents=True)
    outside.mkdir()
    os.symlink(outside, root / "link")
    assert within(str(root / "mine"), [root]) and within(str(root), [root])
    assert allowed_folder(str(root / "mine"), [root]) == allowed_folder("mine", [root]) == root / "mine"
    for refused in (str(outside), f"{root}/../outside", "../outside", f"{root}x/mine", str(root / "link")):
        with pytest.raises(APIError) as error:
            allowed_folder(refused, [root])
        assert (error.value.status, error.value.code, error.value.param) == (
            400, "adapter_path_not_allowed", "lora_path")


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A model folder (config.json alone), and a rank-8 and a rank-16 adapter under the root."""
    monkeypatch.setenv("PROBSERVE_HOME", str(tmp_path))
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text(json.dumps(TINY))
    for rank in (8, 16):
        folder = tmp_path / "adapters" / f"r{rank}"
        folder.mkdir(parents=True)
        build_adapter(folder, tmp_path / "base", StoreAdapter("tiny-llama", rank), seed=rank)
    return tmp_path


def catalog_of(home, max_lora_rank: int = 16, other_lora_model: bool = False,
               spawned: list | None = None) -> Catalog:
    """`spawned`: where the catalog's background work goes, to be awaited by the test."""
    shared = {"name": "shared", "path": str(home / "adapters/r8")}
    lora = {"max_lora_rank": max_lora_rank, "adapters": [shared]}
    models = [{"name": "base", "path": str(home / "base"), "lora": lora},
              {"name": "plain", "path": str(home / "base")}]
    if other_lora_model:
        models.append({"name": "other", "path": str(home / "base"), "lora": {}})
    return Catalog(AppConfig.model_validate({"models": models}), retry_after_s=1,
                   spawn=(spawned if spawned is not None else []).append)


def load(catalog: Catalog, owner: str, name: str, folder, tenant: Tenant = ANYONE, **more):
    return catalog.load(owner, tenant, LoadAdapterRequest(lora_name=name, lora_path=str(folder), **more))


async def refused(call) -> tuple[int, str]:
    with pytest.raises(APIError) as error:
        await call
    return error.value.status, error.value.code


@in_a_loop
async def test_a_loaded_adapter_is_its_tenants_alone(home):
    catalog = catalog_of(home)
    served = await load(catalog, "acme", "mine", home / "adapters/r8")
    assert (served.name, served.model.name, served.owner) == ("mine", "base", "acme")
    assert (await catalog.find("mine", "acme", ANYONE)).revision == served.revision
    assert await catalog.find("mine", "globex", ANYONE) is None
    assert [s.name for s in await catalog.listed("acme", ANYONE)] == ["base", "shared", "plain", "mine"]
    assert [s.name for s in await catalog.listed("globex", ANYONE)] == ["base", "shared", "plain"]
    # A tenant no longer allowed the base model loses its adapters with it.
    assert await catalog.find("mine", "acme", Tenant(models=["plain"])) is None
    assert await refused(catalog.unload("globex", ANYONE, UnloadAdapterRequest(lora_name="mine"))) == (
        404, "model_not_found")
    await catalog.unload("acme", ANYONE, UnloadAdapterRequest(lora_name="mine"))
    assert await catalog.find("mine", "acme", ANYONE) is None


@in_a_loop
async def test_names_are_taken_by_configured_and_loaded_models_and_replaced_only_by_their_owner(home):
    catalog = catalog_of(home)
    for taken in ("base", "shared"):
        assert await refused(load(catalog, "acme", taken, home / "adapters/r8")) == (
            409, "adapter_name_taken")
    first = await load(catalog, "acme", "mine", home / "adapters/r8")
    assert await refused(load(catalog, "acme", "mine", home / "adapters/r16")) == (409, "adapter_name_taken")
    assert await refused(load(catalog, "globex", "mine", home / "adapters/r16", load_inplace=True)) == (
        409, "adapter_name_taken")
    again = await load(catalog, "acme", "mine", home / "adapters/r16", load_inplace=True)
    assert again.revision != first.revision and again.adapter.path.endswith("r16")
    assert await refused(catalog.unload("acme", ANYONE, UnloadAdapterRequest(lora_name="shared"))) == (
        409, "adapter_configured")


@in_a_loop
async def test_what_does_not_fit_is_refused_with_its_code_and_nothing_stored(home):
    catalog = catalog_of(home, max_lora_rank=8)
    (home / "adapters/empty").mkdir()
    for folder, code in ((home / "adapters/r16", "adapter_rank_too_large"),
                         (home / "adapters/empty", "adapter_not_found"),
                         (home / "adapters/absent", "adapter_not_found"),
                         (home / "base", "adapter_path_not_allowed")):
        assert await refused(load(catalog, "acme", "mine", folder)) == (400, code)
    assert await catalog.registry.all() == []


@in_a_loop
async def test_the_base_model_is_the_only_one_serving_lora_or_named(home):
    assert (await load(catalog_of(home), "acme", "mine", home / "adapters/r8")).model.name == "base"
    two = catalog_of(home, other_lora_model=True)
    assert await refused(load(two, "acme", "mine", home / "adapters/r8")) == (400, "invalid_request")
    assert await refused(load(two, "acme", "mine", home / "adapters/r8", base_model="plain")) == (
        400, "lora_not_enabled")
    assert await refused(load(two, "acme", "mine", home / "adapters/r8", base_model="gone")) == (
        404, "model_not_found")
    assert (await load(two, "acme", "mine", home / "adapters/r8", base_model="other")).model.name == "other"


@in_a_loop
async def test_a_tenant_loads_within_its_count_and_its_roots(home):
    catalog = catalog_of(home)
    (home / "adapters/acme").mkdir()
    build_adapter(home / "adapters/acme", home / "base", StoreAdapter("tiny-llama", 8), seed=3)
    limited = Tenant(limits=TenantLimits(max_adapters=1, adapter_roots=[str(home / "adapters/acme")]))
    assert await refused(load(catalog, "acme", "one", home / "adapters/r8", limited)) == (
        400, "adapter_path_not_allowed")
    await load(catalog, "acme", "one", home / "adapters/acme", limited)
    assert await refused(load(catalog, "acme", "two", home / "adapters/acme", limited)) == (
        400, "adapter_limit_reached")
    await load(catalog, "acme", "one", home / "adapters/acme", limited, load_inplace=True)  # a replacement


@in_a_loop
async def test_an_adapter_with_a_request_in_flight_is_not_unloaded(home):
    spawned = []
    catalog = catalog_of(home, spawned=spawned)
    served = await load(catalog, "acme", "mine", home / "adapters/r8")
    release = await catalog.lease(served)
    unload = UnloadAdapterRequest(lora_name="mine")
    assert await refused(catalog.unload("acme", ANYONE, unload)) == (409, "adapter_in_use")
    release()
    (sent,) = spawned
    await sent
    await catalog.unload("acme", ANYONE, unload)


@in_a_loop
async def test_a_lease_its_ingress_never_released_ends_by_itself():
    now = [1000.0]
    registry = MemoryRegistry(clock=lambda: now[0])
    await registry.add(LoadedAdapter.new("mine", "base", "acme", "/x"), replace=False)
    await registry.lease("mine", "request-1")
    now[0] += LEASE_S - 1
    assert await registry.leased("mine") == 1
    now[0] += 2
    assert await registry.leased("mine") == 0


@in_a_loop
async def test_the_registry_adds_a_name_once_unless_replacing():
    registry = MemoryRegistry()
    first, second = (LoadedAdapter.new("mine", "base", tenant, "/x") for tenant in ("acme", "globex"))
    assert await registry.add(first, replace=False) and not await registry.add(second, replace=False)
    assert (await registry.get("mine")).tenant == "acme"
    assert LoadedAdapter.loads(first.dumps()) == first
