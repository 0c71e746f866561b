"""OpenAI's Files and Batch endpoints for the ingress: uploads streamed to storage, files and
batch records read back, each tenant's own (serve_app.batch.storage); the batch runner
(serve_app.batch.runner) works the batches, each line through the online pipeline at the
batch's priority (`BatchAPI.line`). Storage is read off the ingress's event loop, in a thread:
it may be a network volume, and a tenant's listing reads each of its records."""

import asyncio
import dataclasses
import functools
import uuid
from collections.abc import Callable

from fastapi import Request
from fastapi.responses import FileResponse, Response
from ray.serve.handle import DeploymentHandle

from serve_app.api.request_models import (
    BATCH_RULES,
    BatchRequest,
    ChatRequest,
    CompletionRequest,
    parse_request,
)
from serve_app.batch import records
from serve_app.batch.storage import Storage
from serve_app.batch.upload import receive_upload, too_large
from serve_app.config import BatchConfig
from serve_app.errors import APIError, invalid
from serve_app.front.http import json_object, json_response
from serve_app.front.pipeline import ENDPOINTS, Endpoint, RequestPipeline
from serve_app.observe.metrics import RequestObserver
from serve_app.observe.request_log import RequestRecord, observed

MULTIPART_OVERHEAD = 64 << 10  # the boundaries and small fields around a file part
PURPOSES = ("batch",)


def fits_a_batch(body: CompletionRequest | ChatRequest) -> None:
    """A batch line's answer is one line of its output file."""
    if body.stream:
        raise invalid("stream", "a batch line cannot stream: its answer is one line of the output "
                      "file; leave stream out", "invalid_batch_line")
    if getattr(body, "prompt_logprobs", None) == -1:
        raise invalid("prompt_logprobs", "the full vocabulary (prompt_logprobs: -1) is not offered in "
                      "a batch: send it to /v1/completions online", "invalid_batch_line")


def line_answer(record: RequestRecord, status: int, body: dict, retry_after: str | None = None) -> dict:
    record.status = status
    return {"status": status, "body": body, "request_id": record.request_id,
            "retry_after": int(retry_after) if retry_after else None}


def storage_read(read: Callable) -> Callable:
    """An endpoint that reads storage: the caller's tenant, then the read in a thread."""
    @functools.wraps(read)
    async def endpoint(self: "BatchAPI", request: Request, *args) -> Response:
        tenant = await self.pipeline.tenant_name(request)
        return await asyncio.to_thread(read, self, tenant, *args)
    return endpoint


class BatchAPI:
    def __init__(self, config: BatchConfig, pipeline: RequestPipeline, observer: RequestObserver,
                 runner: DeploymentHandle):
        self.config, self.pipeline, self.observer, self.runner = config, pipeline, observer, runner
        self.max_body_bytes = pipeline.config.ingress.max_body_bytes
        self.storage = Storage(config.root())

    async def line(self, tenant_name: str, endpoint: str, body: dict) -> dict:
        """One request line of a batch (serve_app.batch.runner) for its tenant, through the
        endpoint's own parse, admission and charge: its status, answer or refusal's envelope,
        request id and the wait a refusal names."""
        record = RequestRecord(request_id=uuid.uuid4().hex, method="POST", endpoint=f"batch {endpoint}")
        with observed(record, self.observer):
            try:
                answer = await self.line_body(tenant_name, record, ENDPOINTS[endpoint], body)
                return line_answer(record, 200, answer)
            except APIError as error:
                record.code = error.code
                retry_after = (error.headers or {}).get("Retry-After")
                return line_answer(record, error.status, error.envelope(), retry_after)

    async def line_body(self, tenant_name: str, record: RequestRecord, endpoint: Endpoint,
                        body: dict) -> dict:
        """A line's answer as online, at the batch's priority."""
        tenant = await self.pipeline.access.admit_named(tenant_name, record)
        rules = self.pipeline.rules(endpoint)
        parsed = await self.pipeline.parsed(tenant, record, body, endpoint.request, rules)
        fits_a_batch(parsed.body)
        parsed = dataclasses.replace(parsed, priority=self.config.priority)
        return await self.pipeline.answer(parsed, await self.pipeline.admit(parsed, endpoint), endpoint)

    async def upload(self, request: Request) -> Response:
        """POST /v1/files: `purpose` and one `file` part, as the openai SDK sends them."""
        tenant = await self.pipeline.tenant_name(request)
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.config.max_file_bytes + MULTIPART_OVERHEAD:
            raise too_large(self.config.max_file_bytes)
        file_id, partial = self.storage.new_file(tenant)
        try:
            upload = await receive_upload(request.stream(), request.headers.get("content-type"),
                                          partial, self.config.max_file_bytes)
            purpose = upload.fields.get("purpose")
            if purpose not in PURPOSES:
                raise invalid("purpose", f"purpose must be one of {', '.join(PURPOSES)}, got {purpose!r}",
                              "invalid_purpose")
            if upload.filename is None:
                raise invalid("file", "the upload has no file part", "missing_file")
            return json_response(self.storage.record_file(tenant, file_id, partial, upload.filename, purpose))
        finally:
            partial.unlink(missing_ok=True)

    @storage_read
    def files(self, tenant: str, purpose: str | None) -> Response:
        listed = [f for f in self.storage.files(tenant) if purpose in (None, f["purpose"])]
        return json_response({"object": "list", "data": listed, "has_more": False})

    @storage_read
    def file(self, tenant: str, file_id: str) -> Response:
        return json_response(self.storage.file(tenant, file_id))

    @storage_read
    def content(self, tenant: str, file_id: str) -> Response:
        """The file's bytes, streamed from storage."""
        return FileResponse(self.storage.file_data(tenant, file_id), media_type="application/octet-stream")

    @storage_read
    def delete(self, tenant: str, file_id: str) -> Response:
        self.storage.file(tenant, file_id)
        users = [b["id"] for b in self.storage.batches(tenant)
                 if b["input_file_id"] == file_id and not records.is_finished(b)]
        if users:
            raise APIError(409, "file_in_use", f"file {file_id!r} is the input of batch {users[0]!r}, "
                           "which has not finished: cancel it first", "file_id")
        self.storage.delete_file(tenant, file_id)
        return json_response({"id": file_id, "object": "file", "deleted": True})

    async def create(self, request: Request) -> Response:
        """POST /v1/batches: the record, then the runner starts on it."""
        tenant = await self.pipeline.tenant_name(request)
        body = parse_request(BatchRequest, await json_object(request, self.max_body_bytes), BATCH_RULES)
        source = await asyncio.to_thread(self.storage.file, tenant, body.input_file_id)
        if source["purpose"] != "batch":
            raise invalid("input_file_id", f"file {body.input_file_id!r} has purpose {source['purpose']!r}; "
                          "a batch reads a file uploaded with purpose batch", "invalid_file_purpose")
        record = records.new_batch(body)
        await asyncio.to_thread(self.storage.save_batch, tenant, record)
        await self.runner.start.remote(tenant, record["id"])
        return json_response(record)

    @storage_read
    def batch(self, tenant: str, batch_id: str) -> Response:
        return json_response(self.storage.batch(tenant, batch_id))

    @storage_read
    def batches(self, tenant: str, after: str | None, limit: int) -> Response:
        return json_response(records.page(self.storage.batches(tenant), after, limit))

    async def cancel(self, request: Request, batch_id: str) -> Response:
        tenant = await self.pipeline.tenant_name(request)
        records.cancellable(await asyncio.to_thread(self.storage.batch, tenant, batch_id))
        return json_response(await self.runner.cancel.remote(tenant, batch_id))
