"""Where files and batches live: a folder every ingress replica and the batch runner see
(PROBSERVE_HOME/batch on one machine; a shared volume on a cluster), one folder per tenant, so
that a tenant reaches only its own. Every record is a JSON file written whole (a temporary file
renamed into place): a reader never sees half of one, and a crash leaves the old one.

    <root>/<tenant>/files/<file id>.json     a file's record (OpenAI's file object)
    <root>/<tenant>/files/<file id>.data     its bytes
    <root>/<tenant>/batches/<batch id>.json  a batch's record (OpenAI's batch object)
    <root>/<tenant>/batches/<batch id>/      its output and error lines while it runs
"""

import os
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote

import orjson

from serve_app.errors import APIError

FILE_ID = re.compile(r"^file-[0-9a-f]{32}$")
BATCH_ID = re.compile(r"^batch_[0-9a-f]{32}$")
ANONYMOUS_FOLDER = "anonymous"  # the tenant of a service without keys


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def tenant_folder(tenant: str) -> str:
    """A folder name for any tenant name, and no two names the same folder."""
    return f"tenant-{quote(tenant, safe='')}" if tenant else ANONYMOUS_FOLDER


def folder_tenant(folder: str) -> str | None:
    if folder == ANONYMOUS_FOLDER:
        return ""
    return unquote(folder.removeprefix("tenant-")) if folder.startswith("tenant-") else None


def write_json(path: Path, record: dict) -> None:
    """The record in place at once: written beside it, then renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    staging.write_bytes(orjson.dumps(record))
    os.replace(staging, path)


def read_json(path: Path) -> dict | None:
    try:
        return orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None


def file_not_found(file_id: str) -> APIError:
    return APIError(404, "file_not_found", f"no file {file_id!r}", "file_id")


def batch_not_found(batch_id: str) -> APIError:
    return APIError(404, "batch_not_found", f"no batch {batch_id!r}", "batch_id")


class Storage:
    def __init__(self, root: Path):
        self.root = root

    def tenant_root(self, tenant: str) -> Path:
        return self.root / tenant_folder(tenant)

    # Files

    def file_paths(self, tenant: str, file_id: str) -> tuple[Path, Path]:
        """A file's record and bytes; 404 for an id this tenant does not have (the same answer
        for another tenant's file as for none)."""
        if not FILE_ID.match(file_id):
            raise file_not_found(file_id)
        folder = self.tenant_root(tenant) / "files"
        return folder / f"{file_id}.json", folder / f"{file_id}.data"

    def new_file(self, tenant: str) -> tuple[str, Path]:
        """An id for a file to come, and where its bytes go until it is recorded."""
        file_id = new_id("file-")
        data = self.file_paths(tenant, file_id)[1]
        data.parent.mkdir(parents=True, exist_ok=True)
        return file_id, data.with_suffix(".partial")

    def record_file(self, tenant: str, file_id: str, written: Path, filename: str, purpose: str) -> dict:
        """The bytes at `written` become the file `file_id`: its record is written last, so a
        file is listed only once whole (a retry after a crash between the two finds the bytes
        already moved)."""
        meta, data = self.file_paths(tenant, file_id)
        data.parent.mkdir(parents=True, exist_ok=True)
        if written.exists() or not data.exists():
            os.replace(written, data)
        record = {"id": file_id, "object": "file", "bytes": data.stat().st_size,
                  "created_at": int(time.time()), "filename": filename, "purpose": purpose,
                  "status": "processed", "expires_at": None, "status_details": None}
        write_json(meta, record)
        return record

    def file(self, tenant: str, file_id: str) -> dict:
        record = read_json(self.file_paths(tenant, file_id)[0])
        if record is None:
            raise file_not_found(file_id)
        return record

    def file_data(self, tenant: str, file_id: str) -> Path:
        self.file(tenant, file_id)
        return self.file_paths(tenant, file_id)[1]

    def files(self, tenant: str) -> list[dict]:
        folder = self.tenant_root(tenant) / "files"
        records = (read_json(path) for path in folder.glob("file-*.json")) if folder.exists() else ()
        return sorted((r for r in records if r), key=lambda r: (r["created_at"], r["id"]), reverse=True)

    def delete_file(self, tenant: str, file_id: str) -> None:
        meta, data = self.file_paths(tenant, file_id)
        self.file(tenant, file_id)
        meta.unlink()  # the record first: from here on the file does not exist
        data.unlink(missing_ok=True)

    # Batches

    def batch_path(self, tenant: str, batch_id: str) -> Path:
        if not BATCH_ID.match(batch_id):
            raise batch_not_found(batch_id)
        return self.tenant_root(tenant) / "batches" / f"{batch_id}.json"

    def work_folder(self, tenant: str, batch_id: str) -> Path:
        """Where a running batch's output and error lines are written."""
        return self.batch_path(tenant, batch_id).with_suffix("")

    def save_batch(self, tenant: str, record: dict) -> None:
        write_json(self.batch_path(tenant, record["id"]), record)

    def batch(self, tenant: str, batch_id: str) -> dict:
        record = read_json(self.batch_path(tenant, batch_id))
        if record is None:
            raise batch_not_found(batch_id)
        return record

    def batches(self, tenant: str) -> list[dict]:
        """The tenant's batches, newest first."""
        folder = self.tenant_root(tenant) / "batches"
        records = (read_json(path) for path in folder.glob("batch_*.json")) if folder.exists() else ()
        return sorted((r for r in records if r), key=lambda r: (r["created_at"], r["id"]), reverse=True)

    def batch_ids(self) -> Iterator[tuple[str, str]]:
        """Every tenant's batches by name, none read: the runner reads those it does not know
        to be finished."""
        for folder in sorted(self.root.glob("*/batches")):
            tenant = folder_tenant(folder.parent.name)
            if tenant is not None:
                yield from ((tenant, path.stem) for path in sorted(folder.glob("batch_*.json")))
