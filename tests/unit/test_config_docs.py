"""The configuration is documented once: every key of a Serve config's `args` has its
description in serve_app/config.py, and docs/operations.md's table has a row for each key and
for no other."""

import pathlib
import re
import types
import typing

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from serve_app.config import AppConfig

OPERATIONS = pathlib.Path(__file__).parents[2] / "docs" / "operations.md"


def keys(model: type[BaseModel], prefix: str = "") -> dict[str, FieldInfo]:
    """Each leaf key of `model` as the docs write it (`models[].capabilities.max_model_len`)."""
    found = {}
    for name, field in model.model_fields.items():
        kind, args = field.annotation, typing.get_args(field.annotation)
        if typing.get_origin(kind) is types.UnionType and type(None) in args:  # an optional section
            (kind,) = [arg for arg in args if arg is not type(None)]
            args = typing.get_args(kind)
        if typing.get_origin(kind) is list and args and issubclass(args[0], BaseModel):
            found |= keys(args[0], f"{prefix}{name}[].")
        elif isinstance(kind, type) and issubclass(kind, BaseModel):
            found |= keys(kind, f"{prefix}{name}.")
        else:
            found[f"{prefix}{name}"] = field
    return found


def documented_keys() -> list[str]:
    """The keys named in the first column of docs/operations.md's configuration table."""
    table = OPERATIONS.read_text().split("| key | default | meaning |\n| --- | --- | --- |\n")[1]
    rows = table.split("\n\n")[0].splitlines()
    return [key for row in rows for key in re.findall(r"`([^`]+)`", row.split(" | ")[0])]


def test_every_key_has_a_description():
    assert [key for key, field in keys(AppConfig).items() if not field.description] == []


def test_the_operations_table_names_every_key_once_and_no_other():
    documented = documented_keys()
    assert sorted(documented) == sorted(keys(AppConfig))


def test_the_walk_reaches_nested_keys():
    found = keys(AppConfig)
    assert {"models[].capabilities.max_model_len", "models[].scored_cache.top_k",
            "models[].lora.max_loras", "models[].lora.adapters[].path",
            "ingress.max_n", "tenancy.storage", "batch.priority"} <= set(found)
    assert "models[].capabilities" not in found and "models[].lora" not in found
