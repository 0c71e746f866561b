"""A batch's record, OpenAI's batch object, through the steps of its life:
validating -> in_progress -> finalizing -> completed, or failed (its file did not pass the
check), cancelling -> cancelled, expired (its completion window passed)."""

import time

from serve_app.api.request_models import BatchRequest
from serve_app.batch.storage import new_id
from serve_app.errors import APIError

WINDOW_S = {"24h": 24 * 3600}
FINISHED = ("failed", "completed", "expired", "cancelled")
STATUSES = ("validating", "in_progress", "finalizing", "cancelling", *FINISHED)
MAX_PAGE = 100


def new_batch(request: BatchRequest) -> dict:
    now = int(time.time())
    return {"id": new_id("batch_"), "object": "batch", "endpoint": request.endpoint, "errors": None,
            "input_file_id": request.input_file_id, "completion_window": request.completion_window,
            "status": "validating", "output_file_id": None, "error_file_id": None, "created_at": now,
            "in_progress_at": None, "expires_at": now + WINDOW_S[request.completion_window],
            "finalizing_at": None, "completed_at": None, "failed_at": None, "expired_at": None,
            "cancelling_at": None, "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0}, "metadata": request.metadata}


def moved(record: dict, status: str, **changes) -> dict:
    """The record in its next step, stamped with that step's time."""
    return {**record, **changes, "status": status, f"{status}_at": int(time.time())}


def is_finished(record: dict) -> bool:
    return record["status"] in FINISHED


def is_expired(record: dict) -> bool:
    return time.time() >= record["expires_at"]


def cancellable(record: dict) -> None:
    if record["status"] in ("finalizing", "failed", "completed", "expired"):
        raise APIError(409, "batch_not_cancellable", f"batch {record['id']!r} is {record['status']}: "
                       "there is nothing left to cancel", "batch_id")


def page(records: list[dict], after: str | None, limit: int) -> dict:
    """OpenAI's cursor list: the records after the one named `after`, `limit` of them."""
    if not 1 <= limit <= MAX_PAGE:
        raise APIError(400, "invalid_request", f"limit must be from 1 to {MAX_PAGE}, got {limit}", "limit")
    ids = [r["id"] for r in records]
    start = ids.index(after) + 1 if after in ids else 0 if after is None else len(ids)
    shown = records[start:start + limit]
    return {"object": "list", "data": shown, "first_id": shown[0]["id"] if shown else None,
            "last_id": shown[-1]["id"] if shown else None, "has_more": start + limit < len(records)}
