"""The two error rows a healthy service cannot show over HTTP: the handlers themselves."""

import asyncio
from functools import partial
from types import SimpleNamespace

import orjson
import pytest
from ray.serve.exceptions import BackPressureError
from starlette.requests import Request

from serve_app.config import IngressConfig
from serve_app.errors import APIError
from serve_app.ingress import Ingress, internal_error


class Failing:
    class check_health:
        @staticmethod
        async def remote():
            raise RuntimeError("engine died")


def test_not_ready_when_a_replica_fails_its_health_check():
    ingress = SimpleNamespace(replicas={"m": Failing()}, config=SimpleNamespace(ingress=IngressConfig()))
    with pytest.raises(APIError) as caught:
        asyncio.run(Ingress.func_or_class.health(ingress))
    assert (caught.value.status, caught.value.code) == (503, "not_ready")
    assert caught.value.headers == {"Retry-After": "1"}


def test_internal_error_is_an_envelope():
    request = Request({"type": "http", "method": "POST", "path": "/v1/completions", "headers": []})
    response = asyncio.run(internal_error(request, ValueError("boom")))
    assert response.status_code == 500
    assert orjson.loads(response.body)["error"]["code"] == "internal_error"


class BreakingStream:
    """A replica handle whose stream yields some deltas, then fails."""

    def __init__(self, deltas: list, error: Exception):
        self.deltas, self.error = deltas, error

    def options(self, stream: bool):
        return self

    @property
    def generate_stream(self):
        return self

    async def remote(self, request):
        for delta in self.deltas:
            yield delta
        raise self.error


INGRESS = SimpleNamespace(config=SimpleNamespace(ingress=IngressConfig(retry_after_s=2)))
INGRESS.refusal = partial(Ingress.func_or_class.refusal, INGRESS)
QUEUE_FULL = BackPressureError(num_queued_requests=3, max_queued_requests=3)


def collect(handle) -> list[bytes]:
    from tests.unit.test_streaming import stream_for

    async def run():
        return [chunk async for chunk in Ingress.func_or_class.events(INGRESS, handle, [None], stream_for())]
    return asyncio.run(run())


@pytest.mark.parametrize("error, code", [(RuntimeError("replica died"), "internal_error"),
                                         (QUEUE_FULL, "overloaded")])
def test_a_stream_that_fails_once_started_ends_with_an_error_event_then_done(error, code):
    from tests.unit.test_streaming import delta

    chunks = collect(BreakingStream([delta(0, [1])], error))
    assert orjson.loads(chunks[0].removeprefix(b"data: "))["choices"][0]["text"] == "b"
    assert orjson.loads(chunks[1].removeprefix(b"data: "))["error"]["code"] == code
    assert chunks[2] == b"data: [DONE]\n\n"


def test_a_stream_refused_before_it_starts_is_an_http_error():
    with pytest.raises(APIError) as caught:
        collect(BreakingStream([], QUEUE_FULL))
    assert (caught.value.status, caught.value.code) == (503, "overloaded")
    assert caught.value.headers == {"Retry-After": "2"}


def slot_holder(**limits) -> SimpleNamespace:
    config = IngressConfig(max_full_vocab_requests=1, **limits)
    ingress = SimpleNamespace(config=SimpleNamespace(ingress=config),
                              full_vocab_slots=asyncio.Semaphore(1), full_vocab_waiting=0)
    ingress.slot = partial(Ingress.func_or_class.full_vocab_slot, ingress)
    return ingress


def test_a_full_vocab_request_waits_for_a_slot_at_most_the_configured_time():
    async def run():
        ingress = slot_holder(full_vocab_wait_s=0.05, max_full_vocab_waiting=4)
        await ingress.slot()
        with pytest.raises(APIError) as caught:
            await ingress.slot()
        assert (caught.value.status, caught.value.code) == (503, "overloaded")
        assert ingress.full_vocab_waiting == 0
        ingress.full_vocab_slots.release()
        await ingress.slot()  # free again
    asyncio.run(run())


def test_beyond_the_waiters_bound_a_request_is_refused_at_once():
    async def run():
        ingress = slot_holder(full_vocab_wait_s=30, max_full_vocab_waiting=1)
        await ingress.slot()
        waiter = asyncio.create_task(ingress.slot())
        await asyncio.sleep(0)
        with pytest.raises(APIError) as caught:
            await asyncio.wait_for(ingress.slot(), 1)  # not the 30 s wait
        assert caught.value.code == "overloaded"
        ingress.full_vocab_slots.release()
        await waiter
    asyncio.run(run())
