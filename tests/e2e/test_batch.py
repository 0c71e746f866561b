"""OpenAI's Files and Batch APIs through the official openai SDK, unchanged, on the session's
service: a batch uploaded, created, polled and downloaded, its answers those the online API
gives the same bodies; invalid lines in the error file with the online envelope, the others
run; a file that fails its check fails the batch; a cancelled batch stops and keeps what it
did; the batch runner, or the model's engine, killed mid-batch, and every line still exactly
once in the output."""

import time

import httpx
import numpy as np
import openai
import orjson
import pytest

from serve_app.ops.chaos import kill_one
from serve_app.ops.local_ray import APP_NAME
from serve_app.store.model_store import SMOLLM2
from tests.e2e.conftest import (
    BATCH_MAX_FILE_BYTES,
    CONFIG,
    MAX_LOGPROBS,
    MODEL,
)
from tests.e2e.reference import TOLERANCE
from tests.e2e.same_answer import assert_same_choice, assert_same_choices
from tests.e2e.test_online_first import BACKGROUND, requests_by_priority

pytestmark = pytest.mark.e2e

WAIT_S = 240


def jsonl(lines: list[dict]) -> bytes:
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


def request_line(custom_id: str, body: dict, url: str = "/v1/completions") -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def scoring(prompt: str, **extra) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0, "echo": True, "logprobs": 2,
            **extra}


def finished(client, batch_id: str, statuses=("completed", "failed", "cancelled", "expired")):
    deadline = time.monotonic() + WAIT_S
    while (batch := client.batches.retrieve(batch_id)).status not in statuses:
        assert time.monotonic() < deadline, batch
        time.sleep(0.5)
    return batch


def results(client, file_id: str | None) -> dict[str, dict]:
    """A result file's lines by custom_id, each custom_id once."""
    if file_id is None:
        return {}
    rows = [orjson.loads(line) for line in client.files.content(file_id).content.splitlines()]
    by_id = {row["custom_id"]: row for row in rows}
    assert len(by_id) == len(rows), "a custom_id twice"
    return by_id


def run_batch(client, lines: list[dict], endpoint: str = "/v1/completions"):
    uploaded = client.files.create(file=("input.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h",
                                  metadata={"suite": "test"})
    assert batch.status == "validating" and batch.metadata == {"suite": "test"}
    return finished(client, batch.id)


def test_the_sdk_runs_a_batch_whose_answers_are_the_online_ones(client, http):
    good = {f"good-{i}": scoring(f"Line {i} of the batch says {i * 3} things.") for i in range(6)}
    good["labels"] = {"model": MODEL, "prompt": "A label follows:", "max_tokens": 1, "temperature": 0,
                      "logprob_token_ids": [5, 17]}
    bad = {"too-many-logprobs": scoring("x", logprobs=MAX_LOGPROBS + 1),
           "no-model": {"prompt": "x", "max_tokens": 1},
           "streamed": scoring("x", echo=False, stream=True),
           "full-vocab": scoring("x", echo=False, logprobs=None, prompt_logprobs=-1)}
    lines = [request_line(i, body) for i, body in {**good, **bad}.items()]
    lines.append({**request_line("wrong-url", good["good-0"]), "url": "/v1/chat/completions"})
    before = requests_by_priority()
    batch = run_batch(client, lines)
    # Each line the engine computed came at the batch's priority, behind online requests.
    assert requests_by_priority().get(BACKGROUND, 0) - before.get(BACKGROUND, 0) == len(good)
    assert batch.status == "completed", batch
    assert batch.request_counts.model_dump() == {"total": len(lines), "completed": len(good),
                                                 "failed": len(lines) - len(good)}
    output, errors = results(client, batch.output_file_id), results(client, batch.error_file_id)
    assert set(output) == set(good) and set(errors) == {line["custom_id"] for line in lines} - set(good)
    for custom_id, body in good.items():
        response = output[custom_id]["response"]
        assert response["status_code"] == 200 and response["request_id"]
        online = http.post("/v1/completions", json=body)
        assert online.status_code == 200
        assert_same_choices(response["body"], online.json())
    # Each refusal the online API gives the same body, in its envelope.
    for custom_id in ("too-many-logprobs", "no-model"):
        online = http.post("/v1/completions", json=bad[custom_id])
        response = errors[custom_id]["response"]
        assert (response["status_code"], response["body"]) == (online.status_code, online.json())
    for custom_id in ("streamed", "full-vocab", "wrong-url"):
        response = errors[custom_id]["response"]
        assert (response["status_code"], response["body"]["error"]["code"]) == (400, "invalid_batch_line")
    assert {b.id for b in client.batches.list(limit=100)} >= {batch.id}
    assert client.files.retrieve(batch.output_file_id).purpose == "batch_output"
    with pytest.raises(openai.ConflictError) as finished_already:
        client.batches.cancel(batch.id)
    assert finished_already.value.code == "batch_not_cancellable"
    with pytest.raises(openai.BadRequestError) as not_an_input:
        client.batches.create(input_file_id=batch.output_file_id, endpoint="/v1/completions",
                              completion_window="24h")
    assert not_an_input.value.code == "invalid_file_purpose"


def test_a_chat_batch(client, http):
    messages = [{"role": "user", "content": f"Name a colour, number {i}."} for i in range(3)]
    bodies = {f"chat-{i}": {"model": SMOLLM2, "messages": [m], "max_tokens": 3, "temperature": 0,
                            "logprobs": True, "top_logprobs": 2} for i, m in enumerate(messages)}
    batch = run_batch(client, [request_line(i, b, "/v1/chat/completions") for i, b in bodies.items()],
                      "/v1/chat/completions")
    assert batch.status == "completed" and batch.error_file_id is None
    output = results(client, batch.output_file_id)
    for custom_id, body in bodies.items():
        online = http.post("/v1/chat/completions", json=body).json()
        ours = output[custom_id]["response"]["body"]["choices"][0]
        assert ours["message"] == online["choices"][0]["message"]
        np.testing.assert_allclose([t["logprob"] for t in ours["logprobs"]["content"]],
                                   [t["logprob"] for t in online["choices"][0]["logprobs"]["content"]],
                                   atol=TOLERANCE)


def test_files_upload_list_read_and_delete(client, base_url):
    content = jsonl([request_line("1", scoring("x"))])
    uploaded = client.files.create(file=("mine.jsonl", content), purpose="batch")
    assert (uploaded.filename, uploaded.bytes, uploaded.purpose) == ("mine.jsonl", len(content), "batch")
    assert client.files.retrieve(uploaded.id).id == uploaded.id
    assert uploaded.id in {f.id for f in client.files.list()}
    assert client.files.content(uploaded.id).content == content
    assert client.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError) as missing:
        client.files.retrieve(uploaded.id)
    assert missing.value.code == "file_not_found"
    with pytest.raises(openai.BadRequestError) as wrong:
        client.files.create(file=("x.jsonl", content), purpose="fine-tune")
    assert wrong.value.code == "invalid_purpose"
    # Past the cap: refused as it streams, nothing kept.
    before = {f.id for f in client.files.list()}
    too_big = httpx.post(f"{base_url}/v1/files", data={"purpose": "batch"},
                         files={"file": ("big.jsonl", b"x" * (BATCH_MAX_FILE_BYTES + 1))})
    assert (too_big.status_code, too_big.json()["error"]["code"]) == (413, "file_too_large")
    assert {f.id for f in client.files.list()} == before


def test_a_file_no_line_of_which_can_be_told_apart_fails_the_batch(client):
    line = request_line("same", scoring("x"))
    batch = run_batch(client, [line, line])
    assert batch.status == "failed" and batch.output_file_id is None
    assert [(e.code, e.line) for e in batch.errors.data] == [("duplicate_custom_id", 2)]
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-" + "0" * 32, endpoint="/v1/completions",
                              completion_window="24h")


def started_batch(client, bodies: dict[str, dict]) -> str:
    lines = [request_line(custom_id, body) for custom_id, body in bodies.items()]
    uploaded = client.files.create(file=("input.jsonl", jsonl(lines)), purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint="/v1/completions",
                                 completion_window="24h").id


def long_lines(count: int, **extra) -> dict[str, dict]:
    """Bodies that differ in their prompt only."""
    return {f"line-{i}": scoring(f"Sentence {i}: " + "the words go on and on " * 12, **extra)
            for i in range(count)}


def assert_answered_as_online(http, output: dict[str, dict], bodies: dict[str, dict],
                              per_request: int) -> None:
    """Every line once in the output, its answer the online API's to its body; the online API
    asked `per_request` of the bodies' prompts a request (they differ in their prompt only)."""
    assert output.keys() == bodies.keys()
    shared = {**next(iter(bodies.values())), "prompt": None}
    assert all({**body, "prompt": None} == shared for body in bodies.values())
    ids = list(bodies)
    for start in range(0, len(ids), per_request):
        group = ids[start:start + per_request]
        online = http.post("/v1/completions", json={**shared, "prompt": [bodies[i]["prompt"] for i in group]})
        assert online.status_code == 200, online.text
        for custom_id, choice in zip(group, online.json()["choices"], strict=True):
            response = output[custom_id]["response"]
            assert response["status_code"] == 200, custom_id
            (answered,) = response["body"]["choices"]
            assert_same_choice(answered, choice)


def wait_for_progress(client, batch_id: str, done: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while (batch := client.batches.retrieve(batch_id)).request_counts.completed < done:
        assert time.monotonic() < deadline and batch.status in ("validating", "in_progress"), batch
        time.sleep(0.2)


def test_a_cancelled_batch_stops_and_keeps_what_it_did(client):
    batch_id = started_batch(client, long_lines(300))
    wait_for_progress(client, batch_id, 5)
    with pytest.raises(openai.ConflictError) as in_use:
        client.files.delete(client.batches.retrieve(batch_id).input_file_id)
    assert in_use.value.code == "file_in_use"
    cancelling = client.batches.cancel(batch_id)
    assert cancelling.status == "cancelling"
    batch = finished(client, batch_id)  # how soon: bench/batch_cancel.py
    assert batch.status == "cancelled"
    output = results(client, batch.output_file_id)
    assert 5 <= len(output) < 300 and batch.request_counts.completed == len(output)
    assert client.batches.cancel(batch_id).status == "cancelled"  # again: nothing changes


def test_a_batch_survives_its_runner_killed_with_every_line_once(client, http):
    count = 60
    bodies = long_lines(count)
    batch_id = started_batch(client, bodies)
    wait_for_progress(client, batch_id, 10)
    kill_one(f"ServeReplica:{APP_NAME}:BatchRunner")
    batch = finished(client, batch_id)
    assert batch.status == "completed", batch
    output, errors = results(client, batch.output_file_id), results(client, batch.error_file_id)
    assert errors == {}
    assert batch.request_counts.model_dump() == {"total": count, "completed": count, "failed": 0}
    assert_answered_as_online(http, output, bodies, CONFIG["ingress"]["max_batch_prompts"])
