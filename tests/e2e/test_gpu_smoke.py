"""`make gpu-smoke`'s script in its CPU mode (bench/gpu_smoke.py), against the session's service
(which serves SmolLM2 too), with a short load run: the checks a GPU machine runs, run here on
every change so that they cannot rot. vLLM's own server, the load run's peer, is left out here
(a minute to start on these cores; bench/load.py runs it the same way)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FULL_VOCAB_POSITIONS = 512  # the GPU's 1,024 take these cores twice as long
CHECKS = ["environment", "echo with top-5", "labels", "a span after a priming request",
          f"full vocabulary, {FULL_VOCAB_POSITIONS} positions",
          "32 scoring requests with 2 full-vocabulary ones", "the same bits alone and among 32 others",
          "load: distinct, 16 clients", "load: echo128, 16 clients"]


def test_the_gpu_smoke_passes_in_its_cpu_mode(base_url, metrics_url, tmp_path):
    command = [sys.executable, "bench/gpu_smoke.py", "--device", "cpu", "--url", base_url,
               "--metrics-url", metrics_url, "--load-requests", "16", "--no-peer",
               "--full-vocab-positions", str(FULL_VOCAB_POSITIONS), "--output", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (table,) = tmp_path.glob("gpu-smoke-*.md")
    rows = [line.split(" | ") for line in table.read_text().splitlines()[4:]]
    assert [row[0].removeprefix("| ") for row in rows] == CHECKS
    assert all(row[1] == "ok" for row in rows), table.read_text()
