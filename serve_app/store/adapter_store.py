"""LoRA adapters the store builds for tests, in PEFT's layout (`adapter_config.json`,
`adapter_model.safetensors`), into `PROBSERVE_HOME/adapters`: each tiny test model and the
embedded model get a seeded adapter of rank 8 and one of rank 16 on every attention and MLP
projection, large enough to move their log-probabilities visibly."""

import json
from dataclasses import dataclass
from pathlib import Path

from serve_app.store.home import adapters_dir

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
TARGET_MODULES = [*ATTENTION, *MLP]
ADAPTER_RANKS = (8, 16)
ADAPTER_SEED = 20261207
A_STD, B_STD = 0.1, 0.05  # (alpha / r) B A moves a tiny model's weights (std 0.2) by ~15%


@dataclass(frozen=True)
class StoreAdapter:
    base: str
    rank: int

    @property
    def alpha(self) -> int:
        return 2 * self.rank


def adapter_name(base: str, rank: int) -> str:
    return f"{base}-lora-r{rank}"


def store_adapters(bases: list[str]) -> dict[str, StoreAdapter]:
    return {adapter_name(base, rank): StoreAdapter(base, rank) for base in bases for rank in ADAPTER_RANKS}


def adapter_path(name: str) -> Path:
    return adapters_dir() / name


def projection_shapes(config: dict) -> dict[str, tuple[int, int]]:
    """Each target projection's (in, out) features in a Llama-style config."""
    hidden, intermediate = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    queries = config["num_attention_heads"] * head_dim
    keys = config.get("num_key_value_heads", config["num_attention_heads"]) * head_dim
    return {"q_proj": (hidden, queries), "k_proj": (hidden, keys), "v_proj": (hidden, keys),
            "o_proj": (queries, hidden), "gate_proj": (hidden, intermediate),
            "up_proj": (hidden, intermediate), "down_proj": (intermediate, hidden)}


def module_path(layer: int, projection: str) -> str:
    block = "self_attn" if projection in ATTENTION else "mlp"
    return f"model.layers.{layer}.{block}.{projection}"


def build_adapter(target: Path, base_folder: Path, adapter: StoreAdapter, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    config = json.loads((base_folder / "config.json").read_text())
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for projection, (features_in, features_out) in projection_shapes(config).items():
            key = f"base_model.model.{module_path(layer, projection)}"
            down = torch.randn(adapter.rank, features_in, generator=generator) * A_STD
            up = torch.randn(features_out, adapter.rank, generator=generator) * B_STD
            tensors[f"{key}.lora_A.weight"], tensors[f"{key}.lora_B.weight"] = down, up
    save_file(tensors, target / "adapter_model.safetensors")
    (target / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": adapter.base,
        "r": adapter.rank, "lora_alpha": adapter.alpha, "lora_dropout": 0.0, "bias": "none",
        "target_modules": TARGET_MODULES, "fan_in_fan_out": False, "use_rslora": False,
        "modules_to_save": None, "inference_mode": True}, indent=2))
