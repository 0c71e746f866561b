"""The container images (docker/) agree with the project: Ray and Python versions, install step,
ports, paths. The images cannot be built in CI, so their Dockerfiles are read here instead."""

import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from serve_app.engine.vllm_fence.touch_points import pinned_versions
from serve_app.ops.local_ray import DEFAULTS, METRICS_PORT, PROXY_CALLBACK
from tests.unit import vllm_sources

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "scripts" / "install.sh"
# build -> the python its install step installs into: Ray's image's, or the GPU image's venv.
IMAGE_PYTHON = {"cpu": "/home/ray/anaconda3/bin/python", "gpu": "/home/ray/venv/bin/python"}
DASHBOARD_PORT = 8265  # Ray's dashboard: `serve deploy` and the job API
BUILDS = tuple(IMAGE_PYTHON)


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def instructions(build: str) -> list[tuple[str, str]]:
    """The Dockerfile's (INSTRUCTION, arguments) in order, continuation lines joined."""
    text = (ROOT / "docker" / f"Dockerfile.{build}").read_text()
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    result = []
    for line in joined.splitlines():
        word, _, rest = line.strip().partition(" ")
        result.append((word.upper(), rest.strip()))
    return result


def arguments(build: str, name: str) -> list[str]:
    return [rest for word, rest in instructions(build) if word == name]


def env(build: str) -> dict[str, str]:
    result = {}
    for rest in arguments(build, "ENV"):
        for item in shlex.split(rest):
            key, _, value = item.partition("=")
            result[key] = value
    return result


def runs(build: str) -> list[list[str]]:
    return [shlex.split(rest) for rest in arguments(build, "RUN")]


def base_image(build: str) -> str:
    args = dict(rest.split("=", 1) for rest in arguments(build, "ARG"))
    (image,) = arguments(build, "FROM")
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], image)


def lowest_python() -> str:
    return ".".join(re.search(r">=\s*(\d+)\.(\d+)", pyproject()["project"]["requires-python"]).groups())


def test_the_cpu_image_is_rays_at_the_pinned_versions():
    (ray_pin,) = [re.fullmatch(r"ray\[serve\]==(\S+)", dep).group(1)
                  for dep in pyproject()["project"]["dependencies"] if dep.startswith("ray[")]
    image = re.fullmatch(r"rayproject/ray:(?P<ray>[\d.]+)-py(?P<python>\d+)-cpu", base_image("cpu"))
    assert image and image["ray"] == ray_pin
    assert image["python"] == lowest_python().replace(".", "") == "311"


def test_the_gpu_images_cuda_is_that_of_the_torch_the_pinned_vllm_pins():
    """The image's CUDA, major and minor, is the one the torch wheel was built with: vLLM's CUDA
    wheel pins torch, and torch's Linux wheel pins NVIDIA's CUDA toolkit packages."""
    image = re.fullmatch(r"nvidia/cuda:(?P<cuda>\d+\.\d+)\.\d+-base-ubuntu22\.04", base_image("gpu"))
    assert image, base_image("gpu")
    torch = vllm_sources.cuda_wheel(pinned_versions()["vllm"]).pin("torch")
    toolkit = vllm_sources.pinned(vllm_sources.torch_requirements(torch), "cuda-toolkit")
    assert image["cuda"] == ".".join(toolkit.split(".")[:2]), (torch, toolkit)


def test_the_gpu_images_python_is_the_lowest_the_project_supports():
    args = dict(rest.split("=", 1) for rest in arguments("gpu", "ARG"))
    assert args["PYTHON_VERSION"] == lowest_python()
    venv = [argv for argv in runs("gpu") if argv[:2] == ["uv", "venv"]]
    python = Path(IMAGE_PYTHON["gpu"])
    assert venv == [["uv", "venv", "--seed", "--python", "${PYTHON_VERSION}", str(python.parents[1])]]
    assert env("gpu")["PATH"].startswith(f"{python.parent}:")


@pytest.mark.parametrize("build", BUILDS)
def test_image_runs_the_install_script_with_its_build(build):
    assert build in pyproject()["project"]["optional-dependencies"]
    installs = [argv for argv in runs(build) if argv[0] == "scripts/install.sh"]
    assert installs == [["scripts/install.sh", IMAGE_PYTHON[build], build]]


@pytest.mark.parametrize("build", BUILDS)
def test_image_exposes_the_services_ports(build):
    http_ports = {yaml.safe_load((ROOT / "deployments" / name).read_text())["http_options"]["port"]
                  for name in ("local.yaml", "gpu.yaml")}
    assert http_ports == {8000}
    exposed = {int(port) for rest in arguments(build, "EXPOSE") for port in rest.split()}
    assert exposed == http_ports | {METRICS_PORT, DASHBOARD_PORT}


@pytest.mark.parametrize("build", BUILDS)
def test_image_environment(build):
    variables = env(build)
    for key, value in {**PROXY_CALLBACK, **DEFAULTS}.items():  # what `probserve serve` sets
        assert variables[key] == value
    assert variables["PROBSERVE_HOME"] == "/home/ray/.cache/probserve"
    # Set before the install step, so what is built at build time lands where serving looks.
    words = instructions(build)
    home_set = next(i for i, (word, rest) in enumerate(words) if word == "ENV" and "PROBSERVE_HOME=" in rest)
    install = next(i for i, (word, rest) in enumerate(words) if word == "RUN" and "install.sh" in rest)
    assert home_set < install


@pytest.mark.parametrize("build", BUILDS)
def test_project_is_copied_to_the_workdir_owned_by_ray(build):
    (copy,) = [shlex.split(rest) for rest in arguments(build, "COPY") if not rest.startswith("--from=")]
    (workdir,) = arguments(build, "WORKDIR")
    assert copy == ["--chown=ray:users", ".", workdir]
    assert workdir == "/home/ray/probserve"


def test_cpu_image_prepares_the_model_the_local_config_serves():
    config = yaml.safe_load((ROOT / "deployments" / "local.yaml").read_text())
    served = {model["name"] for model in config["applications"][0]["args"]["models"]}
    assert served == {"smollm2-135m-instruct"}
    prepares = [argv[3:] for argv in runs("cpu") if argv[:3] == ["probserve", "models", "prepare"]]
    assert len(prepares) == 1 and served <= set(prepares[0])


def test_the_gpu_images_uv_is_the_one_the_install_step_pins():
    (pin,) = re.findall(r"'uv==([\d.]+)'", INSTALL.read_text())
    copies = [shlex.split(rest) for rest in arguments("gpu", "COPY") if rest.startswith("--from=")]
    assert copies == [[f"--from=ghcr.io/astral-sh/uv:{pin}", "/uv", "/usr/local/bin/uv"]]


def test_gpu_image_has_no_embedded_model():
    assert not [argv for argv in runs("gpu") if argv[:1] == ["probserve"]]


def test_install_script_is_executable_and_refuses_an_unknown_build():
    assert INSTALL.is_file() and os.access(INSTALL, os.X_OK)
    subprocess.run(["bash", "-n", str(INSTALL)], check=True)
    # /bin/false as the python: were the build checked after the first pip step, it would exit 1.
    result = subprocess.run(["bash", str(INSTALL), "/bin/false", "nosuch"],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 2
    assert "nosuch" in result.stderr and "cpu or gpu" in result.stderr
    assert "==" not in result.stdout


def test_make_venv_runs_the_install_script():
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^\$\(STAMP\):\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert recipe
    steps = [line.strip() for line in recipe.group(1).splitlines()]
    assert "scripts/install.sh $(PY) $(BUILD) test" in steps
    assert re.search(r"^BUILD \?= cpu$", makefile, re.MULTILINE)  # `make venv`: the CPU build
    assert not [step for step in steps if "pip install" in step]
    # A changed install script makes `make venv` install again.
    stamp = re.search(r"^STAMP := .*\$\(shell cat ([^|]*)\|", makefile, re.MULTILINE)
    assert stamp and "scripts/install.sh" in stamp.group(1).split()


def test_dockerignore_leaves_out_the_local_venv_and_git():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".venv", ".venv-gpu", ".git"} <= ignored
