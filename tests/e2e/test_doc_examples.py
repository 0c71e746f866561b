"""Every example of docs/api.md, run as written (curl and the openai SDK) against the test
service's copy of the embedded default model, only the base URL changed, and what it prints
compared with what the document shows it printing (the block right after it)."""

import pathlib
import re
import subprocess
import sys

import pytest

from tests.e2e.shown_output import mismatch

DOC = pathlib.Path(__file__).parents[2] / "docs" / "api.md"
DOC_URL = "http://127.0.0.1:8000"
# What Ray's driver prints of the session's cluster in an example that joins it (the raylet's
# warnings, "(raylet) WARNING: 8 PYTHON worker processes have been started..."): not the
# example's output.
RAY_DRIVER_LINE = re.compile(r"^(?:\x1b\[\d+m)?\(raylet\).*\n", re.MULTILINE)
# An example, then (blank lines between) the block of what it prints.
EXAMPLES = re.findall(r"```(sh|python)\n(.*?)```\s*```(?:output|json)\n(.*?)```", DOC.read_text(),
                      re.DOTALL)


def test_every_example_shows_what_it_prints():
    runnable = re.findall(r"```(?:sh|python)\n", DOC.read_text())
    assert len(EXAMPLES) == len(runnable)
    assert sum(kind == "sh" for kind, _, _ in EXAMPLES) >= 10
    assert sum(kind == "python" for kind, _, _ in EXAMPLES) >= 10


@pytest.mark.parametrize("shown, printed, problem", [
    ('{"logprob": -0.258, "rank": 1}', '{"logprob":-0.25813,"rank":1}', None),
    ('{"logprob": -0.258, "rank": 1}', '{"logprob":-0.26013,"rank":1}', "number 1"),
    ('{"logprob": -0.258, "rank": 1}', '{"logprob":-0.2587,"rank":1}', "number 1"),  # rounds to -0.259
    ('{"logprob": -0.258, "rank": 1}', '{"logprob":-0.25813,"rank":2}', "number 2"),
    ('{"id": "...", "text": " Paris"}', '{"id":"cmpl-1f3","text":" Paris"}', None),
    ('{"id": "...", "text": " Paris"}', '{"id":"cmpl-1f3","text":" Rome"}', "the text differs"),
])
def test_shown_output_is_compared_to_the_digits_shown(shown, printed, problem):
    found = mismatch(shown, printed)
    assert found == problem or (problem and found.startswith(problem))


def failure_output(done: subprocess.CompletedProcess) -> str:
    """What a failed example said: its last traceback on (else the end of its errors), and the
    end of what it printed."""
    start = done.stderr.rfind("Traceback (most recent call last)")
    told = done.stderr[start:start + 3000] if start >= 0 else done.stderr[-2000:]
    return f"{told}\nprinted: {done.stdout[-1000:]}"


@pytest.mark.parametrize("kind, code, shown", EXAMPLES,
                         ids=[f"{kind}-{i}" for i, (kind, _, _) in enumerate(EXAMPLES)])
def test_example_prints_what_the_document_shows(base_url, tmp_path, kind, code, shown):
    code = code.replace(DOC_URL, base_url)
    command = ["bash", "-eo", "pipefail", "-c", code] if kind == "sh" else [sys.executable, "-c", code]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, failure_output(done)
    printed = RAY_DRIVER_LINE.sub("", done.stdout)
    problem = mismatch(shown, printed)
    assert problem is None, f"{problem}\nshown:\n{shown}\nprinted:\n{printed[:3000]}"
