"""Every example of docs/api.md, run as written (curl and the openai SDK) against the test
service's copy of the embedded default model: only the base URL changes."""

import pathlib
import re
import subprocess
import sys

import pytest

DOC = pathlib.Path(__file__).parents[2] / "docs" / "api.md"
DOC_URL = "http://127.0.0.1:8000"
EXAMPLES = re.findall(r"```(sh|python)\n(.*?)```", DOC.read_text(), re.DOTALL)


def test_every_section_has_examples():
    assert sum(kind == "sh" for kind, _ in EXAMPLES) >= 10
    assert sum(kind == "python" for kind, _ in EXAMPLES) >= 10


@pytest.mark.parametrize("kind, code", EXAMPLES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(EXAMPLES)])
def test_example_runs(base_url, tmp_path, kind, code):
    code = code.replace(DOC_URL, base_url)
    command = ["bash", "-eo", "pipefail", "-c", code] if kind == "sh" else [sys.executable, "-c", code]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() and '"error":' not in done.stdout, done.stdout[:2000]
