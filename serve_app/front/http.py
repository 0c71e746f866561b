"""The ingress's HTTP plumbing: request bodies read within their limit, JSON and streamed
responses, and every error as OpenAI's envelope."""

import logging
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException

from serve_app.errors import APIError, error_envelope
from serve_app.observe.request_log import RequestRecord

logger = logging.getLogger("probserve.ingress")
HTTP_ERROR_CODES = {404: "not_found", 405: "method_not_allowed"}


def json_response(body: dict, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json",
                    headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Every refusal and failure as the envelope, with its status and machine-readable code."""

    @app.exception_handler(APIError)
    async def api_error(_: Request, error: APIError) -> Response:
        return json_response(error.envelope(), error.status, error.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> Response:
        code = HTTP_ERROR_CODES.get(error.status_code, "http_error")
        message = f"{request.method} {request.url.path}: {error.detail}"
        return json_response(error_envelope(error.status_code, code, message), error.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, error: RequestValidationError) -> Response:
        return json_response(error_envelope(400, "invalid_request", str(error)), 400)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, error: Exception) -> Response:
        logger.exception("unexpected error on %s %s", request.method, request.url.path)
        message = f"internal error ({type(error).__name__}); the request was not completed"
        return json_response(error_envelope(500, "internal_error", message), 500)


def is_json(content_type: str | None) -> bool:
    """application/json, with or without parameters; a missing header is taken as JSON."""
    if content_type is None:
        return True
    return content_type.split(";")[0].strip().lower() == "application/json"


async def read_body(request: Request, limit: int) -> bytes:
    """The body, read as it arrives and refused once past `limit` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(int(declared), limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(size, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def too_large(size: int, limit: int) -> APIError:
    return APIError(413, "request_too_large", f"the body has at least {size} bytes; "
                    f"this service takes at most {limit}")


async def json_object(request: Request, limit: int) -> dict:
    content_type = request.headers.get("content-type")
    if not is_json(content_type):
        raise APIError(415, "unsupported_media_type",
                       f"Content-Type must be application/json, got {content_type!r}")
    try:
        body = orjson.loads(await read_body(request, limit))
    except orjson.JSONDecodeError as error:
        raise APIError(400, "invalid_json", f"the body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise APIError(400, "invalid_request",
                       f"the body must be a JSON object, got {type(body).__name__}")
    return body


async def event_stream(events: AsyncIterator[bytes]) -> StreamingResponse:
    """Server-sent events, once the first is ready: a request refused before it (the model's
    queue is full) still gets its HTTP status instead of a 200 stream."""
    first = await anext(events)

    async def all_events() -> AsyncIterator[bytes]:
        yield first
        async for chunk in events:
            yield chunk
    return StreamingResponse(all_events(), media_type="text/event-stream")


async def released_after(chunks: AsyncIterator[bytes], release: Callable[[], None],
                         record: RequestRecord) -> AsyncIterator[bytes]:
    """The chunks, counted in the record as sent; `release` once sent, failed or abandoned."""
    try:
        async with aclosing(chunks):
            async for chunk in chunks:
                yield chunk
                record.full_vocab_bytes += len(chunk)
    finally:
        release()


def streaming_body(chunks: AsyncIterator[bytes], media_type: str, gzip: bool,
                   release: Callable[[], None], record: RequestRecord) -> StreamingResponse:
    """A large body, sent as it is written; `release` (callable once) when it ends."""
    body = released_after(chunks, release, record)
    weakref.finalize(body, release)  # a body never started (the client left) releases too
    headers = {"Content-Encoding": "gzip"} if gzip else {}
    return StreamingResponse(body, media_type=media_type,
                             headers={**headers, "Vary": "Accept, Accept-Encoding"})
