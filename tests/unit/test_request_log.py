import asyncio
from types import SimpleNamespace

import orjson
import pytest

from serve_app.observe.request_log import (
    CLIENT_CLOSED,
    STREAM_FAILED,
    ObservedRequests,
    RequestIdCheck,
    RequestRecord,
    error_code,
    well_formed_request_id,
)


class Observer:
    def __init__(self):
        self.events = []

    def started(self, record: RequestRecord) -> None:
        self.events.append(("started", record.endpoint))

    def finished(self, record: RequestRecord) -> None:
        self.events.append(("finished", record))


def scope(path="/v1/completions", headers=()):
    return {"type": "http", "method": "POST", "path": path, "headers": list(headers)}


def ticking_clock():
    now = [0.0]

    def clock():
        now[0] += 1.0
        return now[0]
    return clock


def run(app, observer, request_scope):
    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b""}
    middleware = ObservedRequests(app, observer, clock=ticking_clock())
    asyncio.run(middleware(request_scope, receive, send))
    return sent


def responding(status, *bodies, model="m", tokens=0):
    async def app(scope, receive, send):
        scope["route"] = SimpleNamespace(path="/v1/completions")  # as FastAPI's router does
        record = scope["state"]["record"]
        record.model, record.prompt_tokens = model, tokens
        await send({"type": "http.response.start", "status": status, "headers": []})
        for i, body in enumerate(bodies):
            await send({"type": "http.response.body", "body": body,
                        "more_body": i < len(bodies) - 1})
    return app


def finished_record(observer) -> RequestRecord:
    (_, record), = [e for e in observer.events if e[0] == "finished"]
    return record


def test_a_success_is_timed_and_carries_what_the_handler_noted():
    observer = Observer()
    run(responding(200, b"", b"{}", model="tiny", tokens=7), observer,
        scope(headers=[(b"x-request-id", b"abc-1")]))
    record = finished_record(observer)
    assert observer.events[0] == ("started", "other")  # no route matched yet
    assert record.endpoint == "/v1/completions"
    assert (record.request_id, record.status, record.code, record.model) == ("abc-1", 200, "", "tiny")
    assert record.prompt_tokens == 7
    # clock ticks: started 1, first non-empty body 2, end 3
    assert record.time_to_first_byte_s == 1.0 and record.duration_s == 2.0


def test_an_error_response_gives_its_envelope_code():
    observer = Observer()
    envelope = orjson.dumps({"error": {"message": "x", "param": None, "code": "model_not_found"}})
    run(responding(404, envelope), observer, scope())
    record = finished_record(observer)
    assert (record.status, record.code) == (404, "model_not_found")


def test_paths_no_route_matched_share_one_endpoint_label():
    async def unrouted(scope, receive, send):
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})
    observer = Observer()
    run(unrouted, observer, scope(path="/anything/a-client/invents"))
    assert finished_record(observer).endpoint == "other"


def test_a_response_that_stops_early_is_marked_client_closed():
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"[", "more_body": True})
        # Starlette returns quietly when the client disconnects mid-stream.
    observer = Observer()
    run(app, observer, scope())
    assert (finished_record(observer).status, finished_record(observer).code) == (200, CLIENT_CLOSED)


def test_a_failure_after_the_start_is_a_stream_failure_and_a_cancel_is_the_client():
    async def failing(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("pool worker died")

    async def cancelled(scope, receive, send):
        raise asyncio.CancelledError
    for app, code, error in [(failing, STREAM_FAILED, RuntimeError),
                             (cancelled, CLIENT_CLOSED, asyncio.CancelledError)]:
        observer = Observer()
        with pytest.raises(error):
            run(app, observer, scope())
        assert finished_record(observer).code == code


@pytest.mark.parametrize("value, kept", [
    (b"0b5c2a4e-7d4f-4c8e-9d2b-111111111111", True),
    (b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", True),
    (b"client:batch/42", True),
    (b"", False), (b"a b", False), (b'a"b', False), (b"x" * 129, False), ("é".encode(), False),
    (b"line\nbreak", False),
])
def test_only_well_formed_request_ids_pass_the_proxy(value, kept):
    assert well_formed_request_id(value) is kept
    seen = {}

    async def app(scope, receive, send):
        seen["headers"] = scope["headers"]
    request_scope = scope(headers=[(b"x-request-id", value), (b"accept", b"*/*")])
    asyncio.run(RequestIdCheck(app)(request_scope, None, None))
    assert ((b"x-request-id", value) in seen["headers"]) is kept
    assert (b"accept", b"*/*") in seen["headers"]


def test_error_code_reads_only_envelopes():
    assert error_code(b'{"error": {"code": "overloaded"}}') == "overloaded"
    assert error_code(b'{"detail": "x"}') == "" and error_code(b"not json") == ""
    assert error_code(b'["list"]') == ""


def test_the_log_line_is_one_json_object_of_the_record():
    record = RequestRecord(request_id="r1", method="POST", endpoint="/v1/completions", model="m",
                           status=200, prompt_tokens=3, duration_s=0.5)
    line = record.log_line()
    assert b"\n" not in line
    parsed = orjson.loads(line)
    assert parsed["event"] == "request" and parsed["request_id"] == "r1"
    assert set(parsed) == {"event", "request_id", "endpoint", "method", "tenant", "model", "status",
                           "code", "prompt_tokens", "scored_tokens", "generated_tokens",
                           "full_vocab_bytes", "queue_time_s", "time_to_first_byte_s", "duration_s"}


def test_noted_headers_join_the_response_and_finish_actions_run_once_it_is_over():
    done = []

    async def app(scope, receive, send):
        record = scope["state"]["record"]
        record.response_headers.update({"x-ratelimit-limit-requests": "10", "retry-after": "9"})
        record.on_finish.append(lambda: done.append("released"))
        record.on_finish.append(lambda: 1 / 0)  # a failing action does not stop the others
        record.on_finish.append(lambda: done.append("counted"))
        await send({"type": "http.response.start", "status": 429, "headers": [(b"retry-after", b"2")]})
        await send({"type": "http.response.body", "body": b"{}"})
    sent = run(app, Observer(), scope())
    assert sent[0]["headers"] == [(b"retry-after", b"2"), (b"x-ratelimit-limit-requests", b"10")]
    assert done == ["released", "counted"]
