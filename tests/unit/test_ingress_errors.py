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
from serve_app.scoring import EngineRequest
from serve_app.telemetry import RequestRecord


class Replica:
    """A model replica handle whose health check passes, fails, or never answers."""

    def __init__(self, outcome: str):
        self.check_health = SimpleNamespace(remote=partial(self.check, outcome))

    @staticmethod
    async def check(outcome: str) -> None:
        if outcome == "fails":
            raise RuntimeError("engine died")
        if outcome == "hangs":
            await asyncio.sleep(60)


def health(outcomes: dict[str, str]):
    ingress = SimpleNamespace(replicas={name: Replica(o) for name, o in outcomes.items()},
                              config=SimpleNamespace(ingress=IngressConfig(readiness_timeout_s=0.1)))
    ingress.readiness = partial(Ingress.func_or_class.readiness, ingress)
    response = asyncio.run(Ingress.func_or_class.health(ingress))
    return response, orjson.loads(response.body)


def test_not_ready_names_the_models_that_are_not_and_the_others_stay_ready():
    response, body = health({"down": "fails", "stuck": "hangs", "up": "passes"})
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert body["error"]["code"] == "not_ready" and body["error"]["message"] == "not ready: down, stuck"
    assert body["models"] == {"down": "RuntimeError: engine died", "stuck": "no answer within 0.1 s",
                              "up": "ready"}


def test_ready_when_every_model_is():
    response, body = health({"a": "passes", "b": "passes"})
    assert response.status_code == 200
    assert body == {"status": "ok", "models": {"a": "ready", "b": "ready"}}


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
REQUEST = EngineRequest(prompt_token_ids=[1], max_tokens=1, temperature=0.0, top_p=1.0)
INGRESS.refusal = partial(Ingress.func_or_class.refusal, INGRESS)
QUEUE_FULL = BackPressureError(num_queued_requests=3, max_queued_requests=3)


def collect(handle) -> list[bytes]:
    from tests.unit.test_streaming import stream_for

    async def run():
        record = RequestRecord(request_id="r", method="POST")
        return [chunk async for chunk in Ingress.func_or_class.events(INGRESS, handle, [REQUEST], record,
                                                                      stream_for())]
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


class Count:
    """The waiting gauge's count, without Ray."""

    def __init__(self):
        self.value = 0

    def change(self, by: int) -> None:
        self.value += by


def slot_holder(**limits) -> SimpleNamespace:
    config = IngressConfig(max_full_vocab_requests=1, **limits)
    ingress = SimpleNamespace(config=SimpleNamespace(ingress=config),
                              full_vocab_slots=asyncio.Semaphore(1), waiting=Count())
    ingress.slot = partial(Ingress.func_or_class.full_vocab_slot, ingress)
    return ingress


def test_a_full_vocab_request_waits_for_a_slot_at_most_the_configured_time():
    async def run():
        ingress = slot_holder(full_vocab_wait_s=0.05, max_full_vocab_waiting=4)
        await ingress.slot()
        with pytest.raises(APIError) as caught:
            await ingress.slot()
        assert (caught.value.status, caught.value.code) == (503, "overloaded")
        assert ingress.waiting.value == 0
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
