"""`prompt_logprobs` in vLLM's order, which clients written against vLLM read (an evaluation
framework's perplexity scorer takes each position's first entry as the prompt token): the
position's own token first with its true rank, then the top k by rank. On every tokenizer
family, on every path that writes it: the top-k JSON, the full vocabulary streamed (plain and
gzip) and a batch line's answer; each checked against the float32 reference."""

import time

import numpy as np
import orjson
import pytest

from tests.e2e.conftest import FAMILIES, MODEL
from tests.e2e.reference import TOLERANCE, assert_rank, assert_top_k

pytestmark = pytest.mark.e2e

TEXT = "The capital of France is Paris, and the river is the Seine."
TOP_K = 2
WAIT_S = 240


def prompt_ids(http, model: str) -> list[int]:
    return http.post("/tokenize", json={"model": model, "prompt": TEXT}).json()["tokens"]


def assert_vllm_order(rows: list, token_ids: list[int], reference_rows: np.ndarray, k: int | None) -> None:
    """Position 0 null; each other position's first entry is its prompt token with the
    reference's logprob and rank, then the top k (the whole vocabulary when None) by rank,
    without the prompt token again, each with the reference's logprob."""
    assert rows[0] is None
    assert len(rows) == len(token_ids)
    for position, (row, token_id) in enumerate(zip(rows[1:], token_ids[1:], strict=True), start=1):
        reference = reference_rows[position]
        (first, own), *others = row.items()
        assert int(first) == token_id, (position, list(row)[:3])
        assert abs(own["logprob"] - reference[token_id]) <= TOLERANCE
        assert_rank(reference, token_id, own["rank"])
        top = [(int(t), entry) for t, entry in others]
        width = k or len(reference)
        assert [entry["rank"] for _, entry in top] == [r for r in range(1, width + 1) if r != own["rank"]]
        np.testing.assert_allclose([entry["logprob"] for _, entry in top],
                                   reference[[t for t, _ in top]], atol=TOLERANCE)
        ranked = sorted([(token_id, own), *top], key=lambda item: item[1]["rank"])[:width]
        assert_top_k(reference, [t for t, _ in ranked], [entry["logprob"] for _, entry in ranked], width)


@pytest.mark.parametrize("model", FAMILIES)
def test_top_k_prompt_logprobs_begin_with_the_prompt_token(http, references, model):
    ids = prompt_ids(http, model)
    answer = http.post("/v1/completions", json={"model": model, "prompt": TEXT, "max_tokens": 1,
                                                "prompt_logprobs": TOP_K})
    assert answer.status_code == 200, answer.text
    assert_vllm_order(answer.json()["choices"][0]["prompt_logprobs"], ids,
                      references[model].prompt_rows(ids), TOP_K)


@pytest.mark.parametrize("encoding", ["identity", "gzip"])
@pytest.mark.parametrize("model", FAMILIES)
def test_the_full_vocabulary_begins_each_position_with_the_prompt_token(http, references, model, encoding):
    ids = prompt_ids(http, model)
    answer = http.post("/v1/completions", headers={"accept-encoding": encoding},
                       json={"model": model, "prompt": TEXT, "max_tokens": 1, "prompt_logprobs": -1})
    assert answer.status_code == 200, answer.text
    assert answer.headers.get("content-encoding", "identity") == encoding
    # httpx inflates a gzip body as it reads it.
    assert_vllm_order(orjson.loads(answer.content)["choices"][0]["prompt_logprobs"], ids,
                      references[model].prompt_rows(ids), None)


def test_a_batch_line_s_prompt_logprobs_begin_with_the_prompt_token(http, reference):
    ids = prompt_ids(http, MODEL)
    line = {"custom_id": "order", "method": "POST", "url": "/v1/completions",
            "body": {"model": MODEL, "prompt": TEXT, "max_tokens": 1, "prompt_logprobs": TOP_K}}
    uploaded = http.post("/v1/files", data={"purpose": "batch"},
                         files={"file": ("order.jsonl", orjson.dumps(line) + b"\n")}).json()
    batch = http.post("/v1/batches", json={"input_file_id": uploaded["id"], "endpoint": "/v1/completions",
                                           "completion_window": "24h"}).json()
    deadline = time.monotonic() + WAIT_S
    while (batch := http.get(f"/v1/batches/{batch['id']}").json())["status"] != "completed":
        assert batch["status"] in ("validating", "in_progress", "finalizing"), batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.5)
    (result,) = http.get(f"/v1/files/{batch['output_file_id']}/content").text.splitlines()
    answer = orjson.loads(result)["response"]
    assert answer["status_code"] == 200, answer
    assert_vllm_order(answer["body"]["choices"][0]["prompt_logprobs"], ids, reference.prompt_rows(ids), TOP_K)
