"""LoRA adapters: configured per base model, served as models of their own; the store's test
adapters in PEFT's layout; the engine asked for each adapter by a number of its own."""

import json
import typing

import pytest
from safetensors import safe_open

from serve_app.adapters import AdapterProblem, check_fits, read_adapter
from serve_app.api.model_list import model_card
from serve_app.config import AppConfig, LoraRank, ModelConfig
from serve_app.engine.engine_adapters import EngineAdapters
from serve_app.engine.replica import ModelReplica
from serve_app.engine.vllm_adapter import engine_args
from serve_app.engine.wire import Adapter, AdapterUnavailable, EngineRequest, routed
from serve_app.store.adapter_store import (
    TARGET_MODULES,
    StoreAdapter,
    build_adapter,
    projection_shapes,
    store_adapters,
)
from serve_app.vllm_constants import LORA_RANKS
from tests.unit.fakes import char_vocabulary, in_a_loop

TINY = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2}


def app(**lora) -> AppConfig:
    return AppConfig(models=[{"name": "tiny-llama", "lora": lora}, {"name": "tiny-llama3"}])


def test_each_adapter_is_served_after_its_base_model():
    config = app(adapters=[{"name": "tiny-llama-lora-r8"}, {"name": "mine", "path": "/data/mine"}])
    assert [(s.name, s.model.name) for s in config.served_models()] == [
        ("tiny-llama", "tiny-llama"), ("tiny-llama-lora-r8", "tiny-llama"), ("mine", "tiny-llama"),
        ("tiny-llama3", "tiny-llama3")]
    assert config.served("mine").adapter.resolved_path().as_posix() == "/data/mine"
    assert config.served("tiny-llama3").adapter is None and config.served("nothing") is None


def test_an_adapter_needs_a_name_of_its_own_and_a_path_unless_the_store_builds_it():
    with pytest.raises(ValueError, match="model and adapter names must be unique"):
        app(adapters=[{"name": "tiny-llama3", "path": "/data/x"}])
    with pytest.raises(ValueError, match="adapter 'mine' needs a path"):
        app(adapters=[{"name": "mine"}])


def test_the_ranks_are_vllms():
    from vllm.config.lora import MaxLoRARanks

    assert typing.get_args(MaxLoRARanks) == LORA_RANKS == typing.get_args(LoraRank)


def test_the_bounds_are_vllms():
    with pytest.raises(ValueError, match="max_cpu_loras \\(2\\) must be at least lora.max_loras \\(4\\)"):
        app(max_cpu_loras=2)
    with pytest.raises(ValueError):
        app(max_lora_rank=12)  # not one of vLLM's ranks


def test_the_engine_enables_lora_only_with_a_lora_section():
    plain = engine_args(ModelConfig(name="tiny-llama"))
    assert plain.enable_lora is False
    args = engine_args(ModelConfig(name="tiny-llama", lora={"max_lora_rank": 8, "max_loras": 2,
                                                            "max_cpu_loras": 3}))
    assert (args.enable_lora, args.max_lora_rank, args.max_loras, args.max_cpu_loras) == (True, 8, 2, 3)
    assert args.lora_target_modules == TARGET_MODULES  # the projections, never lm_head


def test_an_adapters_card_names_its_base_as_parent_and_never_its_folder():
    config = app(adapters=[{"name": "mine", "path": "/data/secret-folder"}])
    model = config.models[0]
    base, adapter = (model_card(config.served(name), model.capabilities, 0, char_vocabulary("ab"))
                     for name in ("tiny-llama", "mine"))
    assert (base["id"], base["parent"]) == ("tiny-llama", None)
    assert (adapter["id"], adapter["parent"]) == ("mine", "tiny-llama")
    assert adapter["capabilities"] == base["capabilities"]
    assert "secret-folder" not in json.dumps(adapter)


def request(adapter: Adapter | None) -> EngineRequest:
    return EngineRequest(prompt_token_ids=[1, 2], max_tokens=1, temperature=0.0, top_p=1.0,
                         tenant="acme", priority=0, adapter=adapter)


def replica(shared: bool = False) -> ModelReplica:
    """The replica's own methods on a bare instance (no engine)."""
    bare = object.__new__(ModelReplica.func_or_class)
    bare.model = ModelConfig(name="tiny-llama", shared_prefix_caches=shared)
    return bare


class Engine:
    """Loads adapters whose folder starts with /ok, as vLLM's add_lora does or raises."""

    def __init__(self):
        self.loaded, self.removed = [], []

    async def add_lora(self, request) -> bool:
        if not request.lora_path.startswith("/ok"):
            raise ValueError(f"no adapter found at {request.lora_path}")
        self.loaded.append(request.lora_int_id)
        return True

    async def remove_lora(self, number: int) -> bool:
        self.removed.append(number)
        return True


async def loaded(adapters: EngineAdapters, adapter: Adapter) -> int:
    """What Serve's multiplexer does with a key it does not hold (it needs a replica)."""
    adapters.by_key[adapter.key] = adapter
    return (await adapters.load(adapter)).request.lora_int_id


@in_a_loop
async def test_each_adapter_has_a_number_of_its_own_in_the_engine_kept_when_dropped():
    adapters = EngineAdapters(Engine(), "tiny-llama", 2)
    first, second = Adapter("a", "/ok/a"), Adapter("b", "/ok/b")
    assert [await loaded(adapters, adapter) for adapter in (first, second)] == [1, 2]
    held = await adapters.load(first)
    await held.__del__()  # as the multiplexer drops the least recently used
    assert adapters.engine.removed == [1] and first.key not in adapters.by_key
    assert await loaded(adapters, first) == 1
    for other in (Adapter("a", "/ok/other"), Adapter("a", "/ok/a", revision="r2")):  # another folder, or load
        assert await loaded(adapters, other) == 3 + (other.revision == "r2")
    assert adapters.engine.loaded == [1, 2, 1, 1, 3, 4]


@in_a_loop
async def test_an_adapter_vllm_cannot_load_is_refused_without_its_folder():
    adapters = EngineAdapters(Engine(), "tiny-llama", 2)
    assert await adapters.request(None) is None
    with pytest.raises(AdapterUnavailable) as refused:
        await loaded(adapters, Adapter("gone", "/secret/gone"))
    assert "gone" in str(refused.value) and "/secret" not in str(refused.value)
    assert adapters.engine.loaded == []


def test_an_adapters_key_tells_loads_and_folders_apart_and_hides_the_folder():
    keys = {Adapter("a", "/x/a").key, Adapter("a", "/y/a").key, Adapter("a", "/x/a", "r2").key}
    assert len(keys) == 3 and not any("/x" in key for key in keys)


@pytest.mark.parametrize("shared", [False, True])
def test_an_adapters_prefix_caches_are_apart_from_the_bases_and_each_others(shared):
    bare = replica(shared)
    namespaces = {bare.cache_namespace(request(adapter))
                  for adapter in (None, Adapter("a", "/x/a"), Adapter("b", "/x/b"), Adapter("a", "/y/a"),
                                  Adapter("a", "/x/a", "r2"))}
    assert len(namespaces) == 5


def test_the_stores_adapters_are_peft_loras_of_every_projection(tmp_path):
    adapter = StoreAdapter("tiny-llama", 8)
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text(json.dumps(TINY))
    build_adapter(tmp_path, tmp_path / "base", adapter, seed=1)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 8, 16)
    assert config["target_modules"] == TARGET_MODULES
    shapes = projection_shapes(TINY)
    with safe_open(tmp_path / "adapter_model.safetensors", "np") as weights:
        keys = set(weights.keys())
        assert len(keys) == 2 * len(TARGET_MODULES) * TINY["num_hidden_layers"]
        down = weights.get_slice("base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight")
        up = weights.get_slice("base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight")
        assert (down.get_shape(), up.get_shape()) == ([8, 128], [64, 8])
        assert shapes["k_proj"] == (128, 64) and shapes["down_proj"] == (256, 128)
        mlp = weights.get_slice("base_model.model.model.layers.0.mlp.down_proj.lora_B.weight")
        assert mlp.get_shape() == [128, 8]


def test_each_tiny_model_has_a_rank_8_and_a_rank_16_adapter():
    adapters = store_adapters(["tiny-llama", "tiny-llama3"])
    assert {name: (a.base, a.rank) for name, a in adapters.items()} == {
        "tiny-llama-lora-r8": ("tiny-llama", 8), "tiny-llama-lora-r16": ("tiny-llama", 16),
        "tiny-llama3-lora-r8": ("tiny-llama3", 8), "tiny-llama3-lora-r16": ("tiny-llama3", 16)}


@pytest.fixture
def built(tmp_path):
    """A rank-8 adapter of a tiny Llama in `adapter/`, the model's config.json in `base/`."""
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text(json.dumps(TINY))
    (tmp_path / "adapter").mkdir()
    build_adapter(tmp_path / "adapter", tmp_path / "base", StoreAdapter("tiny-llama", 8), seed=1)
    return tmp_path / "adapter"


def problem(folder, config=TINY, max_rank=16, targets=TARGET_MODULES) -> tuple[str, str] | None:
    try:
        check_fits(read_adapter(folder), "mine", "tiny-llama", config, max_rank, targets)
    except AdapterProblem as error:
        return error.code, str(error)
    return None


def test_an_adapter_of_the_model_within_its_rank_fits(built):
    assert read_adapter(built).rank == 8 and problem(built) is None


def test_a_rank_above_the_models_bound_is_refused_naming_both(built):
    assert problem(built, max_rank=1) == (
        "adapter_rank_too_large",
        "adapter 'mine' has rank 8; model 'tiny-llama' serves adapters up to max_lora_rank 1")


@pytest.mark.parametrize("other, where", [
    ({"hidden_size": 64}, "model.layers.0.mlp.down_proj lora_B is [128, 8], the model's takes [64, 8]"),
    ({"intermediate_size": 512},
     "model.layers.0.mlp.down_proj lora_A is [8, 256], the model's takes [8, 512]"),
    ({"num_hidden_layers": 1}, "model.layers.1.mlp.down_proj is past its last layer (it has 1)"),
])
def test_an_adapter_of_another_model_is_refused_naming_the_matrix(built, other, where):
    code, message = problem(built, {**TINY, **other})
    assert code == "adapter_mismatch" and where in message


def test_an_adapter_of_a_module_the_model_serves_no_lora_on_is_refused(built):
    code, message = problem(built, targets=["q_proj", "v_proj"])
    assert (code, message) == ("adapter_mismatch", "adapter 'mine' does not fit model 'tiny-llama': it "
                               "changes model.layers.0.mlp.down_proj, and the model serves LoRA on "
                               "q_proj, v_proj only (lora.target_modules)")


def test_no_lora_on_the_logits():
    with pytest.raises(ValueError, match="no LoRA on lm_head"):
        app(target_modules=["q_proj", "lm_head"])


def test_a_folder_without_a_lora_adapter_is_not_found(built, tmp_path):
    (tmp_path / "empty").mkdir()
    assert problem(tmp_path / "empty")[0] == "adapter_not_found"
    config = json.loads((built / "adapter_config.json").read_text())
    (built / "adapter_config.json").write_text(json.dumps({**config, "peft_type": "PROMPT_TUNING"}))
    assert problem(built)[0] == "adapter_not_found"
    (built / "adapter_config.json").write_text(json.dumps(config))
    (built / "adapter_model.safetensors").write_bytes(b"not safetensors")
    assert problem(built)[0] == "adapter_not_found"


class Handle:
    """A deployment handle that records the options it is given."""

    def __init__(self, **options):
        self.options_given = options

    def options(self, **options) -> "Handle":
        return Handle(**self.options_given, **options)


def test_a_request_on_an_adapter_is_routed_by_its_key_and_the_bases_by_none():
    adapter = Adapter("a", "/x/a", "r1")
    assert routed(Handle(), request(adapter)).options_given == {"multiplexed_model_id": adapter.key}
    assert routed(Handle(), request(None)).options_given == {}
