"""prompt_logprobs: -1 end to end: probserve against vLLM's own OpenAI server, same session.

Both serve the embedded SmolLM2-135M-Instruct (vocabulary 49,152) in float32, one after the
other on this machine; each request is timed to the last byte of the gzip-accepting response.

    .venv/bin/python bench/full_vocab_e2e.py [--tokens 64 128] [--repeats 2]
"""

import argparse
import statistics
import time

import httpx
from servers import vllm_server

from serve_app import local
from serve_app.home import apply_cache_environment
from serve_app.models import SMOLLM2, prepare

PORT = 8311


def timed_request(url: str, model: str, tokens: int) -> tuple[float, int]:
    body = {"model": model, "prompt": list(range(100, 100 + tokens)), "max_tokens": 1,
            "prompt_logprobs": -1}
    started = time.perf_counter()
    size = 0
    with httpx.Client(timeout=900) as client:
        with client.stream("POST", f"{url}/v1/completions", json=body,
                           headers={"accept-encoding": "gzip"}) as response:
            for chunk in response.iter_raw():
                size += len(chunk)
    assert response.status_code == 200, response.status_code
    return time.perf_counter() - started, size


def measure(url: str, model: str, sizes: list[int], repeats: int) -> dict[int, float]:
    timed_request(url, model, 8)  # warm-up
    results = {}
    for tokens in sizes:
        runs = [timed_request(url, model, tokens) for _ in range(repeats)]
        results[tokens] = statistics.median(seconds for seconds, _ in runs)
        print(f"  {tokens} tokens: {results[tokens]:.2f} s, {runs[0][1] / 1e6:.0f} MB on the wire",
              flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--repeats", type=int, default=2)
    options = parser.parse_args()
    apply_cache_environment()
    prepare(SMOLLM2)

    print("vLLM's OpenAI server:", flush=True)
    server = vllm_server(PORT)
    try:
        local.wait_healthy(f"http://127.0.0.1:{PORT}")
        baseline = measure(f"http://127.0.0.1:{PORT}", SMOLLM2, options.tokens, options.repeats)
    finally:
        server.terminate()
        server.wait()

    print("probserve:", flush=True)
    url = local.start({"models": [{"name": SMOLLM2}]}, port=PORT, log_to_driver=False)
    try:
        ours = measure(url, SMOLLM2, options.tokens, options.repeats)
    finally:
        local.stop()
    for tokens in options.tokens:
        print(f"{tokens} tokens: vLLM server {baseline[tokens]:.1f} s, probserve {ours[tokens]:.1f} s, "
              f"{baseline[tokens] / ours[tokens]:.1f}x faster")


if __name__ == "__main__":
    main()
