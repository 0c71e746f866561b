"""A LoRA adapter's folder checked against the model it is for, from its files' headers
alone (no weights read): PEFT's layout, a rank within the model's `max_lora_rank`, and each
projection's shapes those of the base model's layer (a Llama-style `config.json`)."""

import json
import re
from dataclasses import dataclass
from pathlib import Path

from serve_app.config import ModelConfig
from serve_app.store.adapter_store import projection_shapes

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
# PEFT's key of one LoRA matrix: base_model.model.<module path>.lora_A.weight
LORA_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<side>[AB])\.weight$")
LAYER = re.compile(r"(?:^|\.)layers\.(?P<layer>\d+)\.")


class AdapterProblem(ValueError):
    """What is wrong with an adapter, with the error code the API answers it with."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class AdapterFiles:
    rank: int
    # Each LoRA matrix's module path, side (A or B) and shape, as the weights file's header says.
    matrices: list[tuple[str, str, list[int]]]


def read_adapter(folder: Path) -> AdapterFiles:
    """The adapter's rank and matrices' shapes; AdapterProblem `adapter_not_found` where the
    folder holds no PEFT LoRA adapter."""
    from safetensors import SafetensorError, safe_open

    config_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    if not config_path.is_file() or not weights_path.is_file():
        raise AdapterProblem("adapter_not_found", f"{folder.name!r} holds no LoRA adapter: it needs "
                             f"{CONFIG_FILE} and {WEIGHTS_FILE} (PEFT's layout)")
    try:
        config = json.loads(config_path.read_text())
        with safe_open(weights_path, "np") as weights:
            shapes = {key: weights.get_slice(key).get_shape() for key in weights.keys()}
    except (ValueError, OSError, SafetensorError) as error:
        raise AdapterProblem("adapter_not_found",
                             f"{folder.name!r}: unreadable adapter files ({error})") from None
    if config.get("peft_type") != "LORA" or not isinstance(config.get("r"), int):
        raise AdapterProblem("adapter_not_found", f"{folder.name!r} is not a LoRA adapter "
                             f"(peft_type {config.get('peft_type')!r}, r {config.get('r')!r})")
    matrices = [(match["module"], match["side"], shape) for key, shape in sorted(shapes.items())
                if (match := LORA_KEY.match(key))]
    if not matrices:
        raise AdapterProblem("adapter_not_found", f"{folder.name!r}: {WEIGHTS_FILE} holds no LoRA matrices")
    return AdapterFiles(config["r"], matrices)


def check_adapter(folder: Path, name: str, model: ModelConfig) -> None:
    """The adapter in `folder` against `model` as it serves LoRA (its config.json read from its
    folder); AdapterProblem where it does not fit."""
    base_config = json.loads((model.resolved_path() / "config.json").read_text())
    check_fits(read_adapter(folder), name, model.name, base_config, model.lora.max_lora_rank,
               model.lora.target_modules)


def check_fits(adapter: AdapterFiles, name: str, base_name: str, base_config: dict, max_rank: int,
               target_modules: list[str]) -> None:
    """AdapterProblem `adapter_rank_too_large` or `adapter_mismatch` (the adapter was made for
    another model, or changes a module the model serves no LoRA on) unless the adapter fits
    the base model as served."""
    if adapter.rank > max_rank:
        raise AdapterProblem("adapter_rank_too_large", f"adapter {name!r} has rank {adapter.rank}; "
                             f"model {base_name!r} serves adapters up to max_lora_rank {max_rank}")
    projections, layers = projection_shapes(base_config), base_config["num_hidden_layers"]
    for module, side, shape in adapter.matrices:
        projection = module.rsplit(".", 1)[-1]
        if projection not in target_modules:
            raise mismatch(name, base_name, f"it changes {module}, and the model serves LoRA on "
                           f"{', '.join(target_modules)} only (lora.target_modules)")
        layer = LAYER.search(module)
        if layer and int(layer["layer"]) >= layers:
            raise mismatch(name, base_name, f"{module} is past its last layer (it has {layers})")
        expected = expected_shape(projection, side, adapter.rank, projections)
        if expected is not None and shape != expected:
            raise mismatch(name, base_name, f"{module} lora_{side} is {shape}, the model's takes {expected}")


def mismatch(name: str, base_name: str, what: str) -> AdapterProblem:
    return AdapterProblem("adapter_mismatch", f"adapter {name!r} does not fit model {base_name!r}: {what}")


def expected_shape(projection: str, side: str, rank: int,
                   projections: dict[str, tuple[int, int]]) -> list[int] | None:
    """A matrix's shape on the base model, lora_A [rank, in] and lora_B [out, rank]; None for
    a module this check does not know (vLLM checks it when it loads the adapter)."""
    features = projections.get(projection)
    if features is None:
        return None
    features_in, features_out = features
    return [rank, features_in] if side == "A" else [features_out, rank]
