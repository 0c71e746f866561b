"""What each HTTP request did, observed once at its end: request ids, the structured log line,
and the record the ingress's metrics are counted from.

Ray Serve's proxy gives every request an `x-request-id` (the client's own, or a new one) and
returns it on the response; `RequestIdCheck` runs in the proxy before that and drops a client
value that is not well formed, so a fresh id replaces it. `ObservedRequests` wraps the
ingress's ASGI app: it times the response, reads the error code from an error response's
envelope, and hands a `RequestRecord` to its sink when the response ends, fails or is left.
"""

import logging
import re
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Protocol

import orjson
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_HEADER = b"x-request-id"
# Printable ASCII without spaces or quotes, as ids from proxies and tracers (UUIDs, W3C trace
# ids, ULIDs) are; bounded so a log line stays small.
WELL_FORMED_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:/+=@-]{1,128}")
MAX_ERROR_BODY = 64 * 1024  # error envelopes are small; a larger body is not read for its code
CLIENT_CLOSED = "client_closed"  # the client left before the response ended (nginx's 499)
STREAM_FAILED = "stream_failed"  # the response failed after it started


def well_formed_request_id(value: bytes) -> bool:
    return WELL_FORMED_REQUEST_ID.fullmatch(value) is not None


class RequestIdCheck:
    """Proxy middleware: a malformed `x-request-id` from a client is dropped (Ray Serve's own
    middleware, inside this one, then makes a new id)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope["headers"] = [(name, value) for name, value in scope["headers"]
                                if name != REQUEST_ID_HEADER or well_formed_request_id(value)]
        await self.app(scope, receive, send)


def proxy_middlewares() -> list[Middleware]:
    """Ray Serve's HTTP proxy callback (RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH)."""
    return [Middleware(RequestIdCheck)]


@dataclass
class RequestRecord:
    """One request as the log line and the metrics see it. Handlers fill in the model and
    the token counts as they learn them."""

    request_id: str
    method: str
    endpoint: str = "other"  # the route's path; "other" for a path no route matched
    tenant: str = ""  # empty when the service takes requests without keys
    model: str = ""
    status: int = 0  # 0: no response was started
    code: str = ""  # the error's machine-readable code; empty on success
    prompt_tokens: int = 0
    scored_tokens: int = 0  # prompt tokens whose logprobs the request asked for
    generated_tokens: int = 0
    full_vocab_bytes: int = 0  # sent, as compressed
    queue_time_s: float | None = None  # before the engine scheduled it (the longest prompt's)
    time_to_first_byte_s: float | None = None
    duration_s: float = 0.0
    # Not logged: headers for the response (rate limits), and what to do once it is over.
    response_headers: dict[str, str] = field(default_factory=dict, repr=False)
    on_finish: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def served(self) -> bool:
        """Answered, not refused: its tokens count (a refusal may follow their count)."""
        return 0 < self.status < 400

    def log_line(self) -> bytes:
        logged = {f.name: getattr(self, f.name) for f in fields(self) if f.repr}
        return orjson.dumps({"event": "request", **logged})


def error_code(body: bytes) -> str:
    """The `code` of an error envelope, or "" when the body is not one."""
    try:
        error = orjson.loads(body).get("error")
        return str(error.get("code") or "") if isinstance(error, dict) else ""
    except (orjson.JSONDecodeError, AttributeError):
        return ""


class Observer(Protocol):
    def started(self, record: RequestRecord) -> None: ...

    def finished(self, record: RequestRecord) -> None: ...


class ObservedRequests:
    """ASGI middleware: a RequestRecord per HTTP request, in `scope["state"]["record"]` for the
    handlers, handed to the observer as the request starts and once its response is over.
    Its endpoint is the path of the route that matched (FastAPI puts it in the scope), so that
    clients cannot add label values with paths of their own."""

    def __init__(self, app: ASGIApp, observer: Observer, clock: Callable[[], float] = time.monotonic):
        self.app, self.observer, self.clock = app, observer, clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = self.clock()
        headers = dict(scope["headers"])
        record = RequestRecord(request_id=headers.get(REQUEST_ID_HEADER, b"").decode("latin1"),
                               method=scope["method"])
        scope.setdefault("state", {})["record"] = record
        error_body = bytearray()
        ended = False

        async def observed_send(message: Message) -> None:
            nonlocal ended
            if message["type"] == "http.response.start":
                record.status = message["status"]
                message = with_headers(message, record.response_headers)
            elif message["type"] == "http.response.body":
                body = message.get("body", b"")
                ended = not message.get("more_body", False)
                if body and record.time_to_first_byte_s is None:
                    record.time_to_first_byte_s = self.clock() - started
                if record.status >= 400 and len(error_body) + len(body) <= MAX_ERROR_BODY:
                    error_body.extend(body)
            await send(message)

        with observed(record, self.observer, self.clock, started):
            try:
                await self.app(scope, receive, observed_send)
            except BaseException as error:
                record.code = record.code or (STREAM_FAILED if isinstance(error, Exception)
                                              else CLIENT_CLOSED)
                raise
            finally:
                record.endpoint = getattr(scope.get("route"), "path", record.endpoint)
                if error_body and not record.code:
                    record.code = error_code(bytes(error_body))
                if not ended and not record.code:  # the server stopped sending: the client left
                    record.code = CLIENT_CLOSED


@contextmanager
def observed(record: RequestRecord, observer: Observer, clock: Callable[[], float] = time.monotonic,
             started: float | None = None):
    """A request handed to the observer as it starts, then timed from `started` (now if None),
    its after-request actions run and handed over again: an HTTP request (the middleware) or a
    batch line (serve_app.batch.runner)."""
    started = clock() if started is None else started
    observer.started(record)
    try:
        yield record
    finally:
        record.duration_s = clock() - started
        for action in record.on_finish:
            run_safely(action)
        observer.finished(record)


def with_headers(start: Message, headers: dict[str, str]) -> Message:
    """A response start with `headers` added, where the response does not set them itself."""
    present = {name.lower() for name, _ in start.get("headers", [])}
    added = [(name.encode(), value.encode()) for name, value in headers.items()
             if name.encode().lower() not in present]
    return {**start, "headers": [*start.get("headers", []), *added]} if added else start


def run_safely(action: Callable[[], None]) -> None:
    try:
        action()
    except Exception:
        logging.getLogger("probserve.requests").exception("after-request action failed")


def separate_logger(name: str, stream, line_format: str) -> logging.Logger:
    """The logger `name`, writing INFO and above to `stream` alone (set up once)."""
    logger = logging.getLogger(name)
    if not logger.handlers:
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter(line_format))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


def request_logger() -> logging.Logger:
    """One JSON line per request on stderr (Ray keeps a replica's stderr in its log folder),
    apart from the service's other logs. Never the prompt, the text or a credential: the
    record has none."""
    return separate_logger("probserve.requests", sys.stderr, "%(message)s")
