"""A batch's lines in OpenAI's formats: the input file checked line by line, each request
line read, and the output and error lines written; what a restarted batch already finished."""

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from serve_app.batch.storage import new_id

MAX_FILE_ERRORS = 100  # a batch that fails its check lists the first of them
MAX_CUSTOM_ID = 512


@dataclass(frozen=True)
class RequestLine:
    custom_id: str
    method: object
    url: object
    body: object


def lines_of(path: Path) -> Iterator[tuple[int, bytes]]:
    """The file's non-blank lines, numbered from 1, one at a time."""
    with path.open("rb") as source:
        for number, line in enumerate(source, 1):
            if line.strip():
                yield number, line


def file_error(code: str, line: int | None, message: str, param: str | None = None) -> dict:
    return {"code": code, "line": line, "message": message, "param": param}


def request_line(number: int, raw: bytes) -> RequestLine | dict:
    """The line's request, or what makes the file unusable (no line a custom_id can name)."""
    try:
        line = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        return file_error("invalid_json_line", number, f"line {number} is not JSON: {error}")
    if not isinstance(line, dict):
        return file_error("invalid_json_line", number, f"line {number} is not a JSON object")
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not 0 < len(custom_id) <= MAX_CUSTOM_ID:
        return file_error("invalid_custom_id", number, f"line {number} needs a custom_id: a string of 1 to "
                          f"{MAX_CUSTOM_ID} characters", "custom_id")
    return RequestLine(custom_id, line.get("method"), line.get("url"), line.get("body"))


def check_input(path: Path, max_lines: int) -> tuple[int, list[dict]]:
    """The number of requests in the file, and what makes it unusable (OpenAI fails such a
    batch): a line that is not a JSON object with a custom_id, a custom_id twice, too many
    lines, none."""
    seen, errors, total = set(), [], 0
    for number, raw in lines_of(path):
        total += 1
        line = request_line(number, raw)
        if isinstance(line, dict):
            errors.append(line)
        elif line.custom_id in seen:
            errors.append(file_error("duplicate_custom_id", number, f"line {number}: custom_id "
                                     f"{line.custom_id!r} is used before; each must be unique", "custom_id"))
        else:
            seen.add(line.custom_id)
        if len(errors) >= MAX_FILE_ERRORS:
            break
    if total > max_lines:
        errors.append(file_error("too_many_lines", None, f"the file has {total} requests; a batch "
                                 f"takes at most {max_lines} (batch.max_lines)"))
    if total == 0:
        errors.append(file_error("empty_file", None, "the file has no requests"))
    return total, errors


def line_refusal(line: RequestLine, endpoint: str) -> dict | None:
    """The envelope of a request line the batch cannot send, or None."""
    problem = (f"method must be POST, got {line.method!r}" if line.method != "POST"
               else f"url must be the batch's endpoint {endpoint}, got {line.url!r}" if line.url != endpoint
               else "body must be a JSON object (the request)" if not isinstance(line.body, dict)
               else None)
    if problem is None:
        return None
    return {"error": {"message": problem, "type": "invalid_request_error", "param": None,
                      "code": "invalid_batch_line"}}


def result_line(custom_id: str, request_id: str, status: int, body: dict) -> bytes:
    """An output line (2xx) or an error-file line (the refusal's envelope), OpenAI's shape."""
    return orjson.dumps({"id": new_id("batch_req_"), "custom_id": custom_id,
                         "response": {"status_code": status, "request_id": request_id, "body": body},
                         "error": None}) + b"\n"


def finished_ids(path: Path) -> set[str]:
    """The custom_ids a file of result lines holds, read line by line, after cutting off a
    last line a crash left unfinished (so that the next line starts clean)."""
    ids, whole = set(), 0
    if not path.exists():
        return ids
    with path.open("rb") as results:
        for line in results:
            if not line.endswith(b"\n"):
                break
            whole += len(line)
            ids.add(orjson.loads(line)["custom_id"])
    if whole < path.stat().st_size:
        os.truncate(path, whole)
    return ids
