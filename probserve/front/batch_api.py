"""OpenAI's Files and Batch endpoints for the ingress: uploads streamed to storage, files and
batch records read back, each tenant's own (probserve.batch.storage); the batch runner
(probserve.batch.runner) works the batches. Storage is read off the ingress's event loop, in a
thread (the ingress calls the other endpoints so): it may be a network volume, and a tenant's
listing reads each of its records."""

import asyncio

from fastapi import Request
from fastapi.responses import FileResponse, Response
from ray.serve.handle import DeploymentHandle

from probserve.api.request_models import BATCH_RULES, BatchRequest, parse_request
from probserve.batch import records
from probserve.batch.storage import Storage
from probserve.batch.upload import receive_upload, too_large
from probserve.config import BatchConfig
from probserve.errors import APIError, invalid
from probserve.front.http import json_object, json_response

MULTIPART_OVERHEAD = 64 << 10  # the boundaries and small fields around a file part
PURPOSES = ("batch",)


class BatchAPI:
    def __init__(self, config: BatchConfig, max_body_bytes: int, runner: DeploymentHandle):
        self.config, self.max_body_bytes, self.runner = config, max_body_bytes, runner
        self.storage = Storage(config.root())

    async def upload(self, request: Request, tenant: str) -> Response:
        """POST /v1/files: `purpose` and one `file` part, as the openai SDK sends them."""
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

    def files(self, tenant: str, purpose: str | None) -> Response:
        listed = [f for f in self.storage.files(tenant) if purpose in (None, f["purpose"])]
        return json_response({"object": "list", "data": listed, "has_more": False})

    def file(self, tenant: str, file_id: str) -> Response:
        return json_response(self.storage.file(tenant, file_id))

    def content(self, tenant: str, file_id: str) -> Response:
        """The file's bytes, streamed from storage."""
        return FileResponse(self.storage.file_data(tenant, file_id), media_type="application/octet-stream")

    def delete(self, tenant: str, file_id: str) -> Response:
        self.storage.file(tenant, file_id)
        users = [b["id"] for b in self.storage.batches(tenant)
                 if b["input_file_id"] == file_id and not records.is_finished(b)]
        if users:
            raise APIError(409, "file_in_use", f"file {file_id!r} is the input of batch {users[0]!r}, "
                           "which has not finished: cancel it first", "file_id")
        self.storage.delete_file(tenant, file_id)
        return json_response({"id": file_id, "object": "file", "deleted": True})

    async def create(self, request: Request, tenant: str) -> Response:
        """POST /v1/batches: the record, then the runner starts on it."""
        body = parse_request(BatchRequest, await json_object(request, self.max_body_bytes), BATCH_RULES)
        source = await asyncio.to_thread(self.storage.file, tenant, body.input_file_id)
        if source["purpose"] != "batch":
            raise invalid("input_file_id", f"file {body.input_file_id!r} has purpose {source['purpose']!r}; "
                          "a batch reads a file uploaded with purpose batch", "invalid_file_purpose")
        record = records.new_batch(body)
        await asyncio.to_thread(self.storage.save_batch, tenant, record)
        await self.runner.start.remote(tenant, record["id"])
        return json_response(record)

    def batch(self, tenant: str, batch_id: str) -> Response:
        return json_response(self.storage.batch(tenant, batch_id))

    def batches(self, tenant: str, after: str | None, limit: int) -> Response:
        return json_response(records.page(self.storage.batches(tenant), after, limit))

    async def cancel(self, tenant: str, batch_id: str) -> Response:
        records.cancellable(await asyncio.to_thread(self.storage.batch, tenant, batch_id))
        return json_response(await self.runner.cancel.remote(tenant, batch_id))
