"""lm-evaluation-harness as the client: its `local-completions` model runs a multiple-choice
task of this script's own making against vLLM's own OpenAI server and against probserve, one
after the other, and the wall time of each evaluation is compared.

The task: 24 questions, each a context of about 650 tokens and four choices of one to three
words (the shape of MMLU's 5-shot prompts), kept in a folder of its own with its YAML. The
harness sends every choice as token ids with `echo: true`, `logprobs: 1`, `max_tokens: 1`, 8
requests in flight, and scores each choice from the echoed logprobs.

lm-eval comes with the test tools (`make venv`).

    .venv/bin/python bench/lm_eval_client.py
"""

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

from lm_eval_task import write_task
from servers import vllm_server
from shared_context import WORDS

from serve_app.ops import cli, local_ray
from serve_app.store.home import apply_cache_environment
from serve_app.store.model_store import SMOLLM2, embedded_model_path, prepare

PORT = 8314
TASK = "probserve_multiple_choice"


def write_questions(folder: Path, count: int) -> None:
    rng = random.Random(0)
    docs = [{"context": f"Question {index}. " + " ".join(rng.choice(WORDS) for _ in range(560)),
             "choices": [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3))) for _ in range(4)],
             "answer": rng.randrange(4)} for index in range(count)]
    write_task(folder, TASK, docs)


def evaluate(url: str, folder: Path) -> tuple[float, dict]:
    """The task through the harness against `url`: its wall time and results."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    model_args = ",".join([f"model={SMOLLM2}", f"base_url={url}/v1/completions", "num_concurrent=8",
                           "tokenized_requests=True", f"tokenizer={embedded_model_path(SMOLLM2)}",
                           "tokenizer_backend=huggingface", "max_retries=1"])
    started = time.perf_counter()
    results = simple_evaluate(model="local-completions", model_args=model_args, tasks=[TASK],
                              task_manager=TaskManager(include_path=str(folder)), log_samples=True)
    return time.perf_counter() - started, results


def loglikelihoods(results: dict) -> list[float]:
    return [response[0] for sample in results["samples"][TASK] for response in sample["filtered_resps"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=24)
    parser.add_argument("--config", type=Path, default=Path("deployments/local.yaml"))
    options = parser.parse_args()
    apply_cache_environment()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    prepare(SMOLLM2)
    folder = Path(tempfile.mkdtemp(prefix="probserve-lm-eval-"))
    write_questions(folder, options.questions)
    found = {}
    server = vllm_server(PORT, kv_cache_gib=1)
    try:
        local_ray.wait_healthy(f"http://127.0.0.1:{PORT}")
        found["vLLM's server"] = evaluate(f"http://127.0.0.1:{PORT}", folder)
    finally:
        server.terminate()
        server.wait()
    args, _, _ = cli.serve_config(options.config)
    url = local_ray.start(args, port=PORT, log_to_driver=False)
    try:
        found["probserve"] = evaluate(url, folder)
    finally:
        local_ray.stop()
    baseline_s, baseline = found["vLLM's server"]
    print("\n| server | wall time of the evaluation | vs vLLM's server | acc | "
          "largest loglikelihood difference |")
    print("| --- | --- | --- | --- | --- |")
    for name, (seconds, results) in found.items():
        difference = max(abs(ours - theirs) for ours, theirs
                         in zip(loglikelihoods(results), loglikelihoods(baseline), strict=True))
        acc = results["results"][TASK]["acc,none"]
        print(f"| {name} | {seconds:.1f} s | {baseline_s / seconds:.2f}x | {acc:.3f} | {difference:.1e} |")


if __name__ == "__main__":
    main()
