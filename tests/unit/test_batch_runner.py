"""The batch runner's work on one batch, against a fake ingress: every line answered once into
the output or error lines, refusals that say to wait retried, a restarted batch resumed where
its lines end, results kept under the same file ids when finishing is done twice, and a
cancelled batch stopped with what it did."""

import asyncio
from types import SimpleNamespace

import orjson
import pytest

from serve_app.api.request_models import BatchRequest
from serve_app.batch import records
from serve_app.batch.runner import BatchRun
from serve_app.batch.storage import Storage
from serve_app.config import BatchConfig

TENANT = "alpha"


class FakeIngress:
    """Answers each line with its prompt; refuses the first `waits` tries of a prompt "wait"
    with 429; holds the lines after the first `answered` until `go` is set."""

    def __init__(self, waits: int = 0, answered: int | None = None):
        self.sent: list[str] = []
        self.waiting: set[str] = set()  # the lines held until `go`
        self.waits, self.answered = waits, answered
        self.go = asyncio.Event()
        self.batch_line = SimpleNamespace(remote=self.answer)

    async def answer(self, tenant: str, endpoint: str, body: dict) -> dict:
        assert tenant == TENANT
        if self.answered is not None and len(self.sent) >= self.answered:
            self.waiting.add(body["prompt"])
            await self.go.wait()
        self.sent.append(body["prompt"])
        if body["prompt"] == "wait" and self.waits:
            self.waits -= 1
            return {"status": 429, "body": {"error": {"code": "rate_limit_exceeded"}}, "request_id": "r",
                    "retry_after": 0.01}
        if body["prompt"] == "bad":
            return {"status": 400, "body": {"error": {"code": "invalid_request"}}, "request_id": "r",
                    "retry_after": None}
        return {"status": 200, "body": {"echo": body["prompt"], "usage": {"prompt_tokens": 2}},
                "request_id": "r", "retry_after": None}


def batch_of(storage: Storage, prompts: list[str]) -> dict:
    lines = b"".join(orjson.dumps({"custom_id": f"id-{i}", "method": "POST", "url": "/v1/completions",
                                   "body": {"prompt": p}}) + b"\n" for i, p in enumerate(prompts))
    file_id, partial = storage.new_file(TENANT)
    partial.write_bytes(lines)
    storage.record_file(TENANT, file_id, partial, "in.jsonl", "batch")
    record = records.new_batch(BatchRequest(input_file_id=file_id, endpoint="/v1/completions",
                                            completion_window="24h"))
    storage.save_batch(TENANT, record)
    return record


def run(storage: Storage, record: dict, ingress: FakeIngress, lines_in_flight: int = 3,
        observed: list | None = None) -> BatchRun:
    batch = BatchRun(storage, TENANT, storage.batch(TENANT, record["id"]), ingress,
                     BatchConfig(), asyncio.Semaphore(lines_in_flight),
                     lambda *line: observed.append(line) if observed is not None else None)
    asyncio.run(batch.run())
    return batch


def result_lines(storage: Storage, file_id: str | None) -> dict[str, dict]:
    if file_id is None:
        return {}
    rows = [orjson.loads(line) for line in storage.file_data(TENANT, file_id).read_bytes().splitlines()]
    return {row["custom_id"]: row["response"] for row in rows}


@pytest.fixture
def storage(tmp_path):
    return Storage(tmp_path)


def test_every_line_is_answered_once_and_a_wait_is_retried(storage):
    prompts = ["a", "b", "wait", "bad", "c"]
    ingress, observed = FakeIngress(waits=2), []
    batch = run(storage, batch_of(storage, prompts), ingress, observed=observed)
    done = storage.batch(TENANT, batch.record["id"])
    assert done["status"] == "completed"
    assert done["request_counts"] == {"total": 5, "completed": 4, "failed": 1}
    output = result_lines(storage, done["output_file_id"])
    errors = result_lines(storage, done["error_file_id"])
    assert {k: v["body"]["echo"] for k, v in output.items()} == {"id-0": "a", "id-1": "b", "id-2": "wait",
                                                                 "id-4": "c"}
    assert errors["id-3"]["status_code"] == 400
    assert ingress.sent.count("wait") == 3 and len(ingress.sent) == 7
    assert storage.file(TENANT, done["output_file_id"])["purpose"] == "batch_output"
    assert sorted(observed) == [("/v1/completions", "completed", 2)] * 4 + [("/v1/completions", "failed", 0)]


def test_a_line_the_batch_cannot_send_never_reaches_the_ingress(storage):
    record = batch_of(storage, ["a"])
    data = storage.file_data(TENANT, record["input_file_id"])
    wrong = {"custom_id": "x", "method": "GET", "url": "/v1/completions", "body": {"prompt": "never"}}
    data.write_bytes(data.read_bytes() + orjson.dumps(wrong) + b"\n")
    ingress = FakeIngress()
    done = run(storage, record, ingress).record
    assert ingress.sent == ["a"]
    assert result_lines(storage, done["error_file_id"])["x"]["body"]["error"]["code"] == "invalid_batch_line"


def test_a_restarted_batch_sends_only_what_it_had_not_finished(storage):
    record = batch_of(storage, [str(i) for i in range(6)])
    running = records.moved(record, "in_progress", request_counts={"total": 6, "completed": 0, "failed": 0})
    storage.save_batch(TENANT, running)
    work = storage.work_folder(TENANT, record["id"])
    work.mkdir(parents=True)
    finished = b"".join(orjson.dumps({"custom_id": f"id-{i}", "response": {"status_code": 200}}) + b"\n"
                        for i in (0, 2))
    (work / "output.jsonl").write_bytes(finished + b'{"custom_id": "id-3", "resp')  # a torn line
    ingress = FakeIngress()
    done = run(storage, running, ingress).record
    assert sorted(ingress.sent) == ["1", "3", "4", "5"]
    assert set(result_lines(storage, done["output_file_id"])) == {f"id-{i}" for i in range(6)}
    assert done["request_counts"] == {"total": 6, "completed": 6, "failed": 0}


def test_finishing_twice_keeps_the_same_files(storage):
    batch = run(storage, batch_of(storage, ["a", "b"]), FakeIngress())
    first = batch.record
    batch.record = records.moved(first, "finalizing", output_file_id=None)  # stopped half way
    batch.finish()
    assert batch.record["status"] == "completed"
    assert batch.record["output_file_id"] == first["output_file_id"]
    assert set(result_lines(storage, first["output_file_id"])) == {"id-0", "id-1"}


def test_a_cancelled_batch_stops_and_keeps_what_it_did(storage):
    record = batch_of(storage, [str(i) for i in range(20)])
    ingress = FakeIngress(answered=4)

    async def cancel_after_some():
        batch = BatchRun(storage, TENANT, record, ingress, BatchConfig(), asyncio.Semaphore(2))
        work = asyncio.create_task(batch.run())
        while len(ingress.sent) < 4:
            await asyncio.sleep(0.001)
        batch.cancelled = True
        batch.move("cancelling")
        ingress.go.set()  # the two lines in flight end; no other starts
        await work
        return batch.record
    done = asyncio.run(cancel_after_some())
    assert done["status"] == "cancelled" and done["cancelled_at"]
    output = result_lines(storage, done["output_file_id"])
    assert 4 <= len(output) < 20 == done["request_counts"]["total"]
    assert done["request_counts"]["completed"] == len(output) == len(ingress.sent)


def test_batches_share_the_runner_s_lines_in_flight(storage):
    """Two batches at once send no more lines together than the runner's bound: the rest of
    each model replica's places stay with online requests."""
    ingress = FakeIngress(answered=0)
    slots = asyncio.Semaphore(3)
    batches = [BatchRun(storage, TENANT, batch_of(storage, [f"{b}-{i}" for i in range(5)]), ingress,
                        BatchConfig(), slots) for b in "ab"]

    async def both():
        work = [asyncio.create_task(batch.run()) for batch in batches]
        await asyncio.sleep(0.05)
        waiting = len(ingress.waiting)
        ingress.go.set()
        await asyncio.gather(*work)
        return waiting
    assert asyncio.run(both()) == 3
    assert all(batch.record["request_counts"]["completed"] == 5 for batch in batches)
