"""The README's layout table agrees with the tree: it names every top-level folder and file a
clone has, and every subpackage and top-level module of the package (docs/architecture.md
places each module: tests/unit/test_layers.py)."""

import re
import subprocess
from pathlib import Path

import serve_app

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(serve_app.__file__).parent
# What a clone has at its top that is no reader's concern: git's and Docker's own, and the README.
UNLISTED = {".gitignore", ".dockerignore", "README.md"}


def layout_rows() -> dict[str, str]:
    """Each row's first cell (its paths, as written) to its second."""
    section = ROOT.joinpath("README.md").read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ", 1) for line in section.splitlines() if line.startswith("| `")]
    return {paths.removeprefix("| "): what for paths, what in rows}


def named_paths() -> set[str]:
    cells = layout_rows()
    return {path.rstrip("/").split("/")[0] for cell in cells for path in re.findall(r"`([^`]+)`", cell)}


def clone_top() -> set[str]:
    """The top-level entries of what git tracks: what a clone has."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return {path.split("/")[0] for path in tracked.stdout.splitlines()} - UNLISTED


def test_every_top_level_entry_has_a_row():
    assert clone_top() == named_paths()


def test_the_package_row_names_every_subpackage_and_module():
    (row,) = [what for paths, what in layout_rows().items() if paths == "`serve_app/`"]
    named = set(re.findall(r"`([a-z_]+/|[a-z_]+\.py)`", row))
    parts = {f"{p.name}/" for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    modules = {p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    assert parts | modules <= named
