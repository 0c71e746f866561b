"""The package's layering (serve_app/__init__.py): a module imports only from its own layer or
below, so the engine never depends on HTTP and pure logic never on a deployment."""

import ast
import re
from pathlib import Path

import serve_app

PACKAGE = Path(serve_app.__file__).parent
# Lowest first; modules of one layer may import each other.
LAYERS = [
    {"text", "store"},
    {"config", "errors", "gate", "parallel", "batch_invariance", "adapters", "vllm_constants"},
    {"observe"},
    {"engine", "tenants"},
    {"fullvocab", "api", "batch"},
    {"front"},
    {"ops"},
]
LEVEL = {part: level for level, parts in enumerate(LAYERS) for part in parts}


def part_of(module: str) -> str:
    """`serve_app.engine.wire` -> `engine`; `serve_app.config` -> `config`."""
    return module.split(".")[1]


def imports(path: Path) -> set[str]:
    """The serve_app modules a file imports, wherever in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("serve_app."):
            found.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.module == "serve_app":
            found.update(f"serve_app.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("serve_app."))
    return found


def modules() -> dict[str, Path]:
    return {".".join(("serve_app", *path.relative_to(PACKAGE).with_suffix("").parts)): path
            for path in PACKAGE.rglob("*.py") if path.name != "__init__.py"}


def test_every_part_has_a_layer():
    assert {part_of(name) for name in modules()} == set(LEVEL)


def test_no_module_imports_a_higher_layer():
    upward = [f"{name} imports {imported}" for name, path in modules().items()
              for imported in imports(path) if LEVEL[part_of(imported)] > LEVEL[part_of(name)]]
    assert upward == []


def test_the_engine_knows_nothing_of_http():
    engine = [imported for name, path in modules().items() if part_of(name) == "engine"
              for imported in imports(path)]
    assert not [m for m in engine if part_of(m) in ("errors", "api", "front", "tenants")]


def test_the_check_sees_an_upward_import(tmp_path):
    offender = tmp_path / "wire.py"
    offender.write_text("from serve_app.front.http import json_response\n")
    assert imports(offender) == {"serve_app.front.http"}
    assert LEVEL[part_of("serve_app.front.http")] > LEVEL[part_of("serve_app.engine.wire")]


def architecture_table() -> list[tuple[list[str], list[str]]]:
    """docs/architecture.md's layer table: each row's subpackages ("" for the top level) and
    the modules it names."""
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    rows = text.split("| layer | subpackage | what lives there |\n| --- | --- | --- |\n")[1].split("\n\n")[0]
    table = []
    for row in rows.splitlines():
        _, where, what = row.split(" | ")[:3]
        parts = [name.rstrip("/") for name in re.findall(r"`([a-z_/]+)/`", where)] or [""]
        table.append((parts, re.findall(r"`([a-z_]+\.py)`", what)))
    return table


def test_the_architecture_table_names_every_module_where_it_lives():
    named = {(PACKAGE / part / module).relative_to(PACKAGE).as_posix()
             for parts, modules in architecture_table() for module in modules for part in parts
             if (PACKAGE / part / module).exists()}
    every = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
             if path.name != "__init__.py"}
    assert sorted(every - named) == [] and sorted(named - every) == []
    unplaced = [module for parts, modules in architecture_table() for module in modules
                if not any((PACKAGE / part / module).exists() for part in parts)]
    assert unplaced == []
