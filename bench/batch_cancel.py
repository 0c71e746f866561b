"""A batch cancelled while it runs: how soon it stops. probserve on the embedded SmolLM2 runs
a batch of echo lines through OpenAI's Batch API; once `--after` lines are done it is
cancelled, and the seconds from the cancel to the `cancelled` status, the lines done when it
was cancelled and the lines the batch kept are printed. (tests/e2e/test_batch.py asserts that
a cancelled batch stops and keeps what it did, not how soon.)

    .venv/bin/python bench/batch_cancel.py
    .venv/bin/python bench/batch_cancel.py --lines 600 --tokens 128 --after 20
"""

import argparse
import tempfile
import time
from pathlib import Path

import httpx
from load import probserve_serving
from online_first import batch_input, finished, started_batch


def completed(client: httpx.Client, batch_id: str) -> int:
    return client.get(f"/v1/batches/{batch_id}").json()["request_counts"]["completed"]


def cancelled(client: httpx.Client, content: bytes, after: int) -> tuple[float, int, int]:
    """The seconds from the cancel to `cancelled`, the lines done when it was sent (as the
    batch's record counts them, saved every second) and the lines the batch kept."""
    batch_id = started_batch(client, content)
    while (done := completed(client, batch_id)) < after:
        time.sleep(0.1)
    sent = time.perf_counter()
    assert client.post(f"/v1/batches/{batch_id}/cancel").json()["status"] == "cancelling"
    batch = finished(client, batch_id)
    took = time.perf_counter() - sent
    assert batch["status"] == "cancelled", batch
    return took, done, batch["request_counts"]["completed"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=300, help="more than get done before the cancel")
    parser.add_argument("--tokens", type=int, default=256, help="per batch line")
    parser.add_argument("--after", type=int, default=5, help="lines done before the cancel")
    parser.add_argument("--config", type=Path, default=Path("deployments/local.yaml"))
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as storage, \
            probserve_serving(options.config, {"batch": {"storage": storage}}) as url, \
            httpx.Client(base_url=url, timeout=60) as client:
        took, done, kept = cancelled(client, batch_input(options.lines, options.tokens), options.after)
    print(f"batch of {options.lines} lines of {options.tokens} tokens, cancelled after {done} lines: "
          f"cancelled {took:.2f} s after the cancel, {kept} lines kept")


if __name__ == "__main__":
    main()
