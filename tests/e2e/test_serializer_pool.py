"""The serializer pool (two workers in the test service): a full-vocabulary body read by two
HTTP clients, a worker that dies mid-stream, a client that leaves mid-stream."""

import gc
import json
import subprocess
import time
import zlib

import httpx
import orjson
import psutil
from ray import serve
from transformers import AutoConfig

from serve_app.ops.local_ray import APP_NAME
from serve_app.store.model_store import SMOLLM2, embedded_model_path
from tests.e2e.conftest import MODEL, ONE_WINDOW
from tests.e2e.full_vocab_body import ROWS_WRITTEN, StreamedRows
from tests.e2e.reference import TOLERANCE
from tests.e2e.test_autoscaling import wait_until
from tests.e2e.test_overload import service_memory
from tests.e2e.test_prefix_reuse import growth, settled_series

# SmolLM2, 256 positions: about 870 MB of JSON, seconds of the pool's work.
LONG = {"model": SMOLLM2, "prompt": list(range(1000, 1256)), "max_tokens": 1, "prompt_logprobs": -1}
# 384 positions, three windows: the pool writes for seconds after the first byte (and Ray
# Serve's proxy takes what the ingress sends without waiting for the client, so the body must
# outlast the time it takes to kill the workers, a fraction of a second).
LONGER = {**LONG, "prompt": list(range(1000, 1384))}


def pool_processes() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"])
            if f"ServeReplica:{APP_NAME}:SerializerPool" in " ".join(p.info["cmdline"] or [])]


def whole_pool() -> bool:
    """Whether every pool worker runs: a worker replaced after the test before killed them
    spends seconds of CPU starting (its vocabularies, the compiled JSON writer)."""
    pool = serve.status().applications[APP_NAME].deployments["SerializerPool"]
    return pool.status == "HEALTHY" and set(pool.replica_states) == {"RUNNING"}


def test_curl_and_httpx_read_the_same_body_as_plain(base_url, http):
    body = {"model": MODEL, "prompt": list(range(5, 5 + ONE_WINDOW)), "max_tokens": 1,
            "temperature": 0, "prompt_logprobs": -1}
    plain = http.post("/v1/completions", json=body, headers={"accept-encoding": "identity"})
    assert "content-encoding" not in plain.headers
    compressed = http.post("/v1/completions", json=body, headers={"accept-encoding": "gzip"})
    assert compressed.headers["content-encoding"] == "gzip"
    by_curl = subprocess.run(
        ["curl", "-sS", "--fail", "--compressed", "-H", "Content-Type: application/json",
         "-d", json.dumps(body), f"{base_url}/v1/completions"], capture_output=True, check=True)
    expected = orjson.loads(plain.content)["choices"]
    assert orjson.loads(compressed.content)["choices"] == expected
    assert orjson.loads(by_curl.stdout)["choices"] == expected
    assert len(expected[0]["prompt_logprobs"]) == ONE_WINDOW


def test_a_pool_worker_that_dies_mid_stream_never_leaves_a_silent_short_body(http):
    """Ray Serve hands a dead worker's chunks to a replacement (the rows stay in the object
    store), so the body may still come whole and valid; if it cannot, the response ends with
    an HTTP-level error. Never a body that looks complete and is not."""
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    rows = StreamedRows()
    try:
        with http.stream("POST", "/v1/completions", json=LONGER,
                         headers={"accept-encoding": "gzip"}) as response:
            assert response.status_code == 200
            body = response.iter_raw()
            rows.feed(inflate.decompress(next(body)))
            workers = pool_processes()
            assert workers
            for process in workers:
                process.kill()
            for chunk in body:
                rows.feed(inflate.decompress(chunk))
    except httpx.HTTPError as error:
        print(f"\npool workers killed mid-stream: the response failed visibly ({error!r})")
    else:
        assert inflate.eof and not inflate.unused_data  # the gzip CRC and length checked
        assert_whole(http, rows)
        print("\npool workers killed mid-stream: the response came whole")
    retry = http.post("/v1/completions", json={**LONG, "prompt": LONG["prompt"][:32]})
    assert retry.status_code == 200 and len(retry.json()["choices"][0]["prompt_logprobs"]) == 32


def assert_whole(http, rows: StreamedRows) -> None:
    """LONGER's body, every row there once and in order: each position the whole vocabulary,
    its likeliest token and logprob the top-1 answer's to the same prompt."""
    envelope = rows.envelope()
    (choice,) = envelope["choices"]
    assert choice["prompt_logprobs"] == [None]
    assert envelope["usage"]["prompt_tokens"] == len(LONGER["prompt"])
    top_1 = http.post("/v1/completions", json={**LONGER, "prompt_logprobs": 1})
    assert top_1.status_code == 200, top_1.text
    expected = [next((int(token), entry["logprob"]) for token, entry in position.items()
                     if entry["rank"] == 1)
                for position in top_1.json()["choices"][0]["prompt_logprobs"][1:]]
    vocab_size = AutoConfig.from_pretrained(embedded_model_path(SMOLLM2)).vocab_size
    assert rows.entries == len(expected) * vocab_size
    for position, ((token, logprob), (top_token, top_logprob)) in enumerate(
            zip(rows.rank_ones, expected, strict=True), start=1):
        assert token == top_token and abs(logprob - top_logprob) <= TOLERANCE, position


def test_a_client_that_leaves_mid_stream_stops_the_pool(http, metrics_url):
    wait_until(whole_pool, time.monotonic())
    http.post("/v1/completions", json={**LONG, "prompt": LONG["prompt"][:32]})
    gc.collect()
    idle = service_memory()
    before = settled_series(metrics_url, ROWS_WRITTEN, SMOLLM2)
    with http.stream("POST", "/v1/completions", json=LONG,
                     headers={"accept-encoding": "identity"}) as response:
        assert response.status_code == 200
        next(response.iter_raw())
    # Once the rows it counts stop growing, the pool has stopped: the chunks in it when the
    # client left are written, and no more come (its CPU after a client leaves:
    # bench/slow_client.py). A pool that went on would write every row of the body.
    written = growth(before, settled_series(metrics_url, ROWS_WRITTEN, SMOLLM2))
    assert written < len(LONG["prompt"]) - 1, written  # the first bytes may come before any row
    after = service_memory()
    assert after <= idle * 1.1, (idle, after)
