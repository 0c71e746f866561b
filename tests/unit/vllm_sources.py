"""vLLM's and Ray's Python sources read as text, never imported: the installed builds, and the
CUDA wheel of the pinned vLLM release (which `scripts/install.sh gpu` installs), downloaded
once by pip into PROBSERVE_HOME. Reading it needs no CUDA."""

import ast
import email.parser
import json
import subprocess
import sys
import tempfile
import zipfile
from functools import cache
from pathlib import Path

from packaging.requirements import Requirement

from serve_app.store.home import probserve_home

DEFINITIONS = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


class Sources:
    """One release's packages under `root` (a site-packages folder or an unpacked wheel)."""

    def __init__(self, root: Path, name: str):
        self.root, self.name = root, name

    def __repr__(self) -> str:
        return self.name

    @cache
    def module(self, dotted: str) -> ast.Module:
        path = self.root.joinpath(*dotted.split("."))
        file = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        return ast.parse(file.read_text(), filename=str(file))

    def pin(self, distribution: str) -> str:
        """The version this wheel's metadata pins `distribution` at."""
        (metadata,) = self.root.glob("*.dist-info/METADATA")
        requirements = email.parser.Parser().parsestr(metadata.read_text()).get_all("Requires-Dist")
        return pinned(requirements, distribution)

    def definition(self, module: str, qualname: str) -> ast.AST:
        """The class or function `qualname` (dotted through classes) of `module`."""
        node = self.module(module)
        for name in qualname.split("."):
            (node,) = [child for child in node.body if isinstance(child, DEFINITIONS) and child.name == name]
        return node

    def constant(self, module: str, qualname: str):
        """The literal a module or class assigns to a name (a field's default, for a class)."""
        *owner, name = qualname.split(".")
        body = self.definition(module, ".".join(owner)).body if owner else self.module(module).body
        (value,) = [statement.value for statement in body if assigned_name(statement) == name]
        return ast.literal_eval(value)


def assigned_name(statement: ast.stmt) -> str | None:
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
        return ast.unparse(statement.targets[0])
    return ast.unparse(statement.target) if isinstance(statement, ast.AnnAssign) else None


def parameters(function: ast.FunctionDef) -> tuple[str, ...]:
    """The parameter names, in inspect.signature's order."""
    arguments = function.args
    starred = [arguments.vararg] if arguments.vararg else []
    keywords = [arguments.kwarg] if arguments.kwarg else []
    return tuple(a.arg for a in [*arguments.posonlyargs, *arguments.args, *starred,
                                 *arguments.kwonlyargs, *keywords])


def pinned(requirements: list[str], distribution: str) -> str:
    """The version of `distribution` that requirements (`name[extras]==version; marker`) pin."""
    (version,) = [str(r.specifier).removeprefix("==") for r in map(Requirement, requirements)
                  if r.name == distribution]
    return version


def torch_requirements(version: str) -> list[str]:
    """What the pinned torch's Linux x86_64 wheel requires (its metadata from PyPI, cached):
    its CUDA build shows in them. Read apart from the local wheel folders, which hold its CPU
    build under the same version."""
    cache = probserve_home() / "vllm-cuda-sources" / f"torch-{version}-requires.json"
    if not cache.is_file():
        cache.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as folder:
            report = Path(folder) / "report.json"
            subprocess.run([sys.executable, "-m", "pip", "install", "--isolated", "--quiet", "--dry-run",
                            "--ignore-installed", "--no-deps", "--only-binary=:all:", "--platform",
                            "manylinux_2_28_x86_64", "--python-version", "3.11", "--target", folder,
                            "--report", str(report), f"torch=={version}"], check=True, timeout=600)
            (install,) = json.loads(report.read_text())["install"]
            cache.write_text(json.dumps(install["metadata"]["requires_dist"]))
    return json.loads(cache.read_text())


def installed(package: str) -> Sources:
    module = __import__(package)
    return Sources(Path(module.__file__).parents[1], f"installed {package}")


def cuda_wheel(version: str) -> Sources:
    """The CUDA wheel's Python files, fetched on first use."""
    root = probserve_home() / "vllm-cuda-sources" / version
    if not root.is_dir():
        unpack_cuda_wheel(version, root)
    return Sources(root, f"vllm {version} CUDA wheel")


def unpack_cuda_wheel(version: str, root: Path) -> None:
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent) as folder:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--only-binary=:all:", "--platform", "manylinux_2_28_x86_64", "--dest", folder,
                        f"vllm=={version}"], check=True, timeout=1200)
        (wheel,) = Path(folder).glob("vllm-*.whl")
        unpacked = Path(folder) / "unpacked"
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(unpacked, [name for name in archive.namelist()
                                          if name.startswith("vllm/") and name.endswith(".py")
                                          or name.endswith(".dist-info/METADATA")])
        unpacked.rename(root)  # whole or not at all
