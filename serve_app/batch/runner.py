"""The batch runner: one replica that works through the batches, each line sent through the
ingress's own parse, admission and charge for the batch's tenant (Ingress.batch_line), its
answer appended to the batch's output or error lines.

Nothing is lost and nothing is done twice in the output: a line's result is appended once it
arrives, and a batch resumed after a restart (the runner's health check looks for unfinished
batches every few seconds) skips the custom_ids its result lines already hold. A refusal that
says to wait (429 from the tenant's limits, 503 from a full queue or a model not ready) is
retried after the wait it names; every other one goes to the error file with its envelope.
The runner writes every record of a batch after its creation, so that no two writers race."""

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from ray import serve

from serve_app.batch import lines, records
from serve_app.batch.lines import RequestLine
from serve_app.batch.storage import Storage
from serve_app.config import AppConfig, BatchConfig
from serve_app.errors import APIError
from serve_app.observe.metrics import BatchMetrics

logger = logging.getLogger("probserve.batch")
RETRIED = (429, 503)
SAVE_EVERY_S = 1.0  # the record's counts, written at most this often while a batch runs


class BatchRun:
    """One batch being worked through."""

    def __init__(self, storage: Storage, tenant: str, record: dict, ingress, config: BatchConfig,
                 slots: asyncio.Semaphore,
                 observe: Callable[[str, str, int], None] = lambda endpoint, outcome, tokens: None):
        self.storage, self.tenant, self.record, self.ingress = storage, tenant, record, ingress
        self.observe = observe  # each line: its endpoint, outcome and prompt tokens
        self.max_lines = config.max_lines
        self.work = storage.work_folder(tenant, record["id"])
        self.output, self.errors = self.work / "output.jsonl", self.work / "errors.jsonl"
        self.slots = slots  # the runner's lines in flight, shared by its batches
        self.cancelled = record["status"] == "cancelling"
        self.saved_at = 0.0

    def save(self, force: bool = True) -> None:
        if force or time.monotonic() - self.saved_at >= SAVE_EVERY_S:
            self.storage.save_batch(self.tenant, self.record)
            self.saved_at = time.monotonic()

    def move(self, status: str, **changes) -> None:
        self.record = records.moved(self.record, status, **changes)
        self.save()

    async def run(self) -> None:
        try:
            source = self.storage.file_data(self.tenant, self.record["input_file_id"])
        except APIError:
            return self.move("failed", errors=errors_list([lines.file_error(
                "input_file_missing", None, "the input file was deleted before the batch ran")]))
        if self.record["status"] == "validating" and not await self.validated(source):
            return
        if self.record["status"] == "in_progress":
            await self.send_lines(source)
        self.finish()

    async def validated(self, source: Path) -> bool:
        total, problems = await asyncio.to_thread(lines.check_input, source, self.max_lines)
        if problems:
            self.move("failed", errors=errors_list(problems))
            return False
        counts = {"total": total, "completed": 0, "failed": 0}
        self.move("cancelling" if self.cancelled else "in_progress", request_counts=counts)
        return True

    async def send_lines(self, source: Path) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        done_output, done_errors = lines.finished_ids(self.output), lines.finished_ids(self.errors)
        self.record["request_counts"].update(completed=len(done_output), failed=len(done_errors))
        done = done_output | done_errors
        with self.output.open("ab") as output, self.errors.open("ab") as errors:
            async with asyncio.TaskGroup() as group:
                for number, raw in lines.lines_of(source):
                    if self.cancelled or records.is_expired(self.record):
                        break
                    line = lines.request_line(number, raw)
                    if line.custom_id in done:
                        continue
                    await self.slots.acquire()
                    group.create_task(self.send(line, output, errors))

    async def send(self, line: RequestLine, output, errors) -> None:
        try:
            answer = await self.answer(line)
            sink = output if answer["status"] < 400 else errors
            sink.write(lines.result_line(line.custom_id, answer["request_id"], answer["status"],
                                         answer["body"]))
            sink.flush()
            outcome = "completed" if sink is output else "failed"
            self.record["request_counts"][outcome] += 1
            self.observe(self.record["endpoint"], outcome, prompt_tokens(answer["body"]))
            self.save(force=False)
        finally:
            self.slots.release()

    async def answer(self, line: RequestLine) -> dict:
        """The ingress's answer to the line, retried while it says to wait."""
        refusal = lines.line_refusal(line, self.record["endpoint"])
        if refusal is not None:
            return {"status": 400, "request_id": "", "body": refusal}
        while True:
            answer = await self.ingress.batch_line.remote(self.tenant, self.record["endpoint"], line.body)
            if answer["status"] not in RETRIED or self.cancelled:
                return answer
            await asyncio.sleep(answer["retry_after"] or 1)

    def finish(self) -> None:
        """The result lines become the batch's output and error files; a runner that stopped
        half way through this does it again (finalizing) with the same file ids."""
        status = self.record["status"]
        if status not in ("in_progress", "cancelling", "finalizing"):
            return
        ending = ("cancelled" if self.cancelled else "completed" if status == "finalizing"
                  else "expired" if records.is_expired(self.record) else "completed")
        # Counted from the result lines themselves: the record's counts are saved now and then.
        self.record["request_counts"].update(completed=len(lines.finished_ids(self.output)),
                                             failed=len(lines.finished_ids(self.errors)))
        if ending == "completed":
            self.move("finalizing")
        produced = {"output_file_id": self.keep(self.output, "output"),
                    "error_file_id": self.keep(self.errors, "error")}
        self.move(ending, **produced)
        with suppress(OSError):
            self.work.rmdir()

    def keep(self, path: Path, kind: str) -> str | None:
        """The result lines at `path` as a file whose id the batch's id decides."""
        file_id = "file-" + uuid.uuid5(uuid.NAMESPACE_URL, f"{self.record['id']}/{kind}").hex
        meta, data = self.storage.file_paths(self.tenant, file_id)
        if meta.exists():
            return file_id
        if not data.exists() and (not path.exists() or path.stat().st_size == 0):
            path.unlink(missing_ok=True)
            return None
        name = f"{self.record['id']}_{kind}.jsonl"
        return self.storage.record_file(self.tenant, file_id, path, name, "batch_output")["id"]


def prompt_tokens(body: dict) -> int:
    return (body.get("usage") or {}).get("prompt_tokens", 0)


def errors_list(problems: list[dict]) -> dict:
    return {"object": "list", "data": problems}


@serve.deployment(num_replicas=1, max_ongoing_requests=1000, health_check_period_s=2)
class BatchRunner:
    def __init__(self, config: AppConfig):
        self.config = config.batch
        self.storage = Storage(config.batch.root())
        self.runs: dict[tuple[str, str], BatchRun] = {}
        self.finished: dict[tuple[str, str], str] = {}  # a finished batch's status never changes
        self.tasks: set[asyncio.Task] = set()
        self.slots = asyncio.Semaphore(config.batch.lines_in_flight)
        self.app_name = serve.get_replica_context().app_name
        self.metrics = BatchMetrics()

    async def start(self, tenant: str, batch_id: str) -> None:
        """Works through the batch, from where it stands, unless it is already running."""
        if (tenant, batch_id) in self.runs:
            return
        record = self.storage.batch(tenant, batch_id)
        if records.is_finished(record):
            return
        ingress = serve.get_deployment_handle("Ingress", self.app_name)
        run = BatchRun(self.storage, tenant, record, ingress, self.config, self.slots, self.metrics.line)
        self.runs[tenant, batch_id] = run
        task = asyncio.get_running_loop().create_task(self.watched(run))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def watched(self, run: BatchRun) -> None:
        try:
            await run.run()
        except Exception:
            # Left as it stands: the next health check resumes it where its lines end.
            logger.exception("batch %s stopped; it resumes", run.record["id"])
        finally:
            del self.runs[run.tenant, run.record["id"]]

    async def cancel(self, tenant: str, batch_id: str) -> dict:
        """Stops the batch: the lines in flight end, the rest are not sent; what was done is
        kept in its files."""
        run = self.runs.get((tenant, batch_id))
        record = run.record if run else self.storage.batch(tenant, batch_id)
        if records.is_finished(record) or record["status"] in ("cancelling", "finalizing"):
            return record
        if run is None:
            self.storage.save_batch(tenant, records.moved(record, "cancelling"))
            await self.start(tenant, batch_id)
            return self.storage.batch(tenant, batch_id)
        run.cancelled = True
        run.move("cancelling")
        return run.record

    async def check_health(self) -> None:
        """Every few seconds: the batches left unfinished (a restart, a lost start) resume,
        and the batches by status are counted."""
        counts = dict.fromkeys(records.STATUSES, 0)
        for key in self.storage.batch_ids():
            counts[self.finished.get(key) or await self.status_resumed(*key)] += 1
        self.metrics.counted(counts)

    async def status_resumed(self, tenant: str, batch_id: str) -> str:
        """The batch's status, after starting it again if it is left unfinished."""
        record = self.storage.batch(tenant, batch_id)
        if records.is_finished(record):
            self.finished[tenant, batch_id] = record["status"]
        else:
            await self.start(tenant, batch_id)
        return record["status"]
