"""The two error rows a healthy service cannot show over HTTP: the handlers themselves."""

import asyncio
from types import SimpleNamespace

import orjson
import pytest
from starlette.requests import Request

from serve_app.errors import APIError
from serve_app.ingress import Ingress, internal_error


class Failing:
    class check_health:
        @staticmethod
        async def remote():
            raise RuntimeError("engine died")


def test_not_ready_when_a_replica_fails_its_health_check():
    ingress = SimpleNamespace(replicas={"m": Failing()})
    with pytest.raises(APIError) as caught:
        asyncio.run(Ingress.func_or_class.health(ingress))
    assert (caught.value.status, caught.value.code) == (503, "not_ready")


def test_internal_error_is_an_envelope():
    request = Request({"type": "http", "method": "POST", "path": "/v1/completions", "headers": []})
    response = asyncio.run(internal_error(request, ValueError("boom")))
    assert response.status_code == 500
    assert orjson.loads(response.body)["error"]["code"] == "internal_error"


class BreakingStream:
    """A replica handle whose stream yields one delta, then fails."""

    def __init__(self, delta):
        self.delta = delta

    def options(self, stream: bool):
        return self

    @property
    def generate_stream(self):
        return self

    async def remote(self, request):
        yield self.delta
        raise RuntimeError("replica died")


def test_a_failing_stream_ends_with_an_error_event_then_done():
    from tests.unit.test_streaming import delta, stream_for

    stream = stream_for()
    events = Ingress.func_or_class.events(SimpleNamespace(), BreakingStream(delta(0, [1])), [None], stream)

    async def collect():
        return [chunk async for chunk in events]

    chunks = asyncio.run(collect())
    assert orjson.loads(chunks[0].removeprefix(b"data: "))["choices"][0]["text"] == "b"
    assert orjson.loads(chunks[1].removeprefix(b"data: "))["error"]["code"] == "internal_error"
    assert chunks[2] == b"data: [DONE]\n\n"
