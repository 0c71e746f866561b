"""The error rows a healthy service cannot show over HTTP: the handlers, the replica client
and the full-vocabulary slots themselves."""

import asyncio
from functools import partial
from types import SimpleNamespace

import orjson
import pytest
from ray.exceptions import ActorDiedError, RayTaskError
from ray.serve.exceptions import BackPressureError
from starlette.requests import Request

from serve_app.config import IngressConfig, ModelConfig, SerializerPoolConfig
from serve_app.engine.wire import EngineRequest, EngineUnavailable, QueueTimeout
from serve_app.errors import APIError
from serve_app.front import full_vocab
from serve_app.front.full_vocab import FullVocabResponses
from serve_app.front.http import install_error_handlers
from serve_app.front.ingress import Ingress
from serve_app.front.replica_client import ReplicaClient
from serve_app.observe.request_log import RequestRecord


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


class Running:
    """Replica counts as serve_app.observe.availability knows them, set by the test."""

    def __init__(self, **counts: int):
        self.counts = counts

    def running(self, deployment: str) -> int | None:
        return self.counts.get(deployment.removeprefix("Model-"))

    async def known(self, deployment: str) -> int | None:
        return self.running(deployment)


def health(outcomes: dict[str, str], running: Running = Running(), scales_to_zero: tuple = ()):
    def model(name: str) -> ModelConfig:
        least = 0 if name in scales_to_zero else 1
        return ModelConfig(name="tiny-llama", autoscaling_config={"min_replicas": least, "max_replicas": 1})
    config = SimpleNamespace(ingress=IngressConfig(readiness_timeout_s=0.1), model=model,
                             models=[SimpleNamespace(name=name) for name in outcomes])
    replicas = {name: Replica(o) for name, o in outcomes.items()}
    ingress = SimpleNamespace(config=config, engines=ReplicaClient(config, replicas, running))
    response = asyncio.run(Ingress.func_or_class.health(ingress))
    return response, orjson.loads(response.body)


def test_not_ready_names_the_models_that_are_not_and_the_others_stay_ready():
    response, body = health({"down": "fails", "stuck": "hangs", "up": "passes"})
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert body["error"]["code"] == "not_ready" and body["error"]["message"] == "not ready: down, stuck"
    assert body["models"] == {"down": "RuntimeError: engine died", "stuck": "no answer within 0.1 s",
                              "up": "ready"}


def test_a_model_without_a_running_replica_is_not_ready_without_asking_it():
    response, body = health({"lost": "hangs", "up": "passes"}, Running(lost=0, up=1))
    assert response.status_code == 503
    assert body["models"] == {"lost": "no running replica", "up": "ready"}


def test_a_model_scaled_to_zero_is_serving_and_not_woken_by_health():
    response, body = health({"idle": "hangs", "up": "passes"}, Running(idle=0, up=1),
                            scales_to_zero=("idle",))
    assert response.status_code == 200
    assert body["models"] == {"idle": "scaled to zero", "up": "ready"}


def test_ready_when_every_model_is():
    response, body = health({"a": "passes", "b": "passes"})
    assert response.status_code == 200
    assert body == {"status": "ok", "models": {"a": "ready", "b": "ready"}}


def test_internal_error_is_an_envelope():
    app = SimpleNamespace(handlers={})
    app.exception_handler = lambda kind: lambda handler: app.handlers.setdefault(kind, handler)
    install_error_handlers(app)
    request = Request({"type": "http", "method": "POST", "path": "/v1/completions", "headers": []})
    response = asyncio.run(app.handlers[Exception](request, ValueError("boom")))
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


MODEL = ModelConfig(name="tiny-llama")
REQUEST = EngineRequest(prompt_token_ids=[1], max_tokens=1, temperature=0.0, top_p=1.0, tenant="t",
                        priority=0)
QUEUE_FULL = BackPressureError(num_queued_requests=3, max_queued_requests=3)


def client_with(handle, running: Running) -> ReplicaClient:
    config = SimpleNamespace(ingress=IngressConfig(retry_after_s=2), model=lambda name: MODEL)
    return ReplicaClient(config, {MODEL.name: handle}, running)


def collect(handle, running: Running = Running()) -> list[bytes]:
    from tests.unit.test_streaming import stream_for

    async def run():
        record = RequestRecord(request_id="r", method="POST")
        events = client_with(handle, running).events(MODEL.name, [REQUEST], record, stream_for())
        return [chunk async for chunk in events]
    return asyncio.run(run())


@pytest.mark.parametrize("error, code", [(RuntimeError("replica died"), "internal_error"),
                                         (QUEUE_FULL, "overloaded"),
                                         (QueueTimeout("waited 2.5 s"), "overloaded"),
                                         (ActorDiedError(), "not_ready")])
def test_a_stream_that_fails_once_started_ends_with_an_error_event_then_done(error, code):
    from tests.unit.test_streaming import delta

    chunks = collect(BreakingStream([delta(0, [1])], error))
    assert orjson.loads(chunks[0].removeprefix(b"data: "))["choices"][0]["text"] == "b"
    assert orjson.loads(chunks[1].removeprefix(b"data: "))["error"]["code"] == code
    assert chunks[2] == b"data: [DONE]\n\n"


@pytest.mark.parametrize("error, code", [(QueueTimeout("waited 2.5 s for a place"), "overloaded"),
                                         (EngineUnavailable("its engine stopped"), "not_ready")])
def test_a_replicas_refusal_keeps_its_message_over_either_of_rays_paths(error, code):
    """Over gRPC the replica's exception comes back as itself; over Ray's task path (the
    full-vocabulary calls) wrapped, its text the replica's traceback."""
    client = client_with(None, Running())
    wrapped = RayTaskError("generate_full_vocab", "Traceback (most recent call last): ...", error)
    for received in (error, wrapped.as_instanceof_cause()):
        refusal = client.refusal(received)
        assert (refusal.status, refusal.code, refusal.message) == (503, code, str(error))
        assert refusal.headers == {"Retry-After": "2"}


def test_a_stream_refused_before_it_starts_is_an_http_error():
    with pytest.raises(APIError) as caught:
        collect(BreakingStream([], QUEUE_FULL))
    assert (caught.value.status, caught.value.code) == (503, "overloaded")
    assert caught.value.headers == {"Retry-After": "2"}


class Stalled(BreakingStream):
    """A stream that gives some deltas, then nothing: its replica was lost and Ray Serve holds
    the request until a new one starts."""

    async def remote(self, request):
        for delta in self.deltas:
            yield delta
        self.running.counts[MODEL.name] = 0  # the controller learns the replica is gone
        await asyncio.sleep(60)


def test_a_stream_whose_model_loses_its_replicas_ends_with_not_ready_instead_of_waiting():
    from tests.unit.test_streaming import delta

    stalled = Stalled([delta(0, [1])], None)
    stalled.running = Running(**{MODEL.name: 1})
    chunks = collect(stalled, stalled.running)
    assert orjson.loads(chunks[1].removeprefix(b"data: "))["error"]["code"] == "not_ready"
    assert chunks[2] == b"data: [DONE]\n\n"


def test_a_request_for_a_model_without_a_running_replica_is_refused_before_it_is_sent():
    with pytest.raises(APIError) as caught:
        collect(BreakingStream([], RuntimeError("never sent")), Running(**{MODEL.name: 0}))
    assert (caught.value.status, caught.value.code) == (503, "not_ready")


class CountedBefore(Running):
    """The last count says no replica; asked afresh, the controller says one started since."""

    def __init__(self, **fresh: int):
        super().__init__(**{name: 0 for name in fresh})
        self.fresh = fresh

    async def known(self, deployment: str) -> int | None:
        self.counts = self.fresh
        return self.running(deployment)


def test_a_request_is_refused_for_want_of_a_replica_only_on_a_fresh_count():
    with pytest.raises(RuntimeError, match="sent"):  # the handle's answer: it was sent
        collect(BreakingStream([], RuntimeError("sent")), CountedBefore(**{MODEL.name: 1}))


def test_a_generation_waiting_for_a_lost_model_is_refused():
    class Waiting:
        """A replica handle whose generate call waits while its model loses its replicas."""

        def options(self, **options):
            self.options_used = options
            return self

        @property
        def generate(self):
            return self

        async def remote(self, request):
            running.counts[MODEL.name] = 0
            await asyncio.sleep(60)

    running, handle = Running(**{MODEL.name: 1}), Waiting()
    client = client_with(handle, running)
    with pytest.raises(APIError) as caught:
        asyncio.run(client.generate(MODEL.name, [REQUEST]))
    assert (caught.value.status, caught.value.code) == (503, "not_ready")
    assert handle.options_used == {"_by_reference": False}  # Ray Serve's gRPC path


class Count:
    """The waiting gauge's count, without Ray."""

    def __init__(self):
        self.value = 0

    def change(self, by: int) -> None:
        self.value += by

    def set(self, value: int) -> None:
        self.value = value


def slot_holder(monkeypatch, **limits) -> FullVocabResponses:
    monkeypatch.setattr(full_vocab, "HeldGauge", lambda name: Count())
    config = SimpleNamespace(ingress=IngressConfig(max_full_vocab_requests=1, **limits),
                             serializer_pool=SerializerPoolConfig())
    return FullVocabResponses(config, serializers=None)


def test_a_full_vocab_request_waits_for_a_slot_at_most_the_configured_time(monkeypatch):
    async def run():
        responses = slot_holder(monkeypatch, full_vocab_wait_s=0.05, max_full_vocab_waiting=4)
        release = await responses.slot()
        with pytest.raises(APIError) as caught:
            await responses.slot()
        assert (caught.value.status, caught.value.code) == (503, "overloaded")
        assert "0 requests wait for one (at most 4, each for at most 0.05 s)" in caught.value.message
        assert responses.slots.waiting == 0
        release()
        release()  # a second release frees nothing more
        await responses.slot()  # free again
        assert responses.slots.held == 1
    asyncio.run(run())


def test_beyond_the_waiters_bound_a_request_is_refused_at_once(monkeypatch):
    async def run():
        responses = slot_holder(monkeypatch, full_vocab_wait_s=30, max_full_vocab_waiting=1)
        release = await responses.slot()
        waiter = asyncio.create_task(responses.slot())
        await asyncio.sleep(0)
        with pytest.raises(APIError) as caught:
            await asyncio.wait_for(responses.slot(), 1)  # not the 30 s wait
        assert caught.value.code == "overloaded"
        assert caught.value.message == ("all 1 full-vocabulary slots of this replica are busy and 1 "
                                        "requests wait for one (at most 1, each for at most 30 s): "
                                        "retry later")
        release()
        await waiter
    asyncio.run(run())
