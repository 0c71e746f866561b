"""The ingress's calls to model replicas: engine requests sent and their results or deltas
back, each model's readiness, and a replica's failures as the client's 503.

Ray Serve holds a request for a deployment without a running replica until one starts (after
a node is lost, until another joins): a model that should always have one is refused at once
instead, and checked again while its requests wait (serve_app.observe.availability)."""

import asyncio
import dataclasses
import enum
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable

from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle

from serve_app.api.streaming import ChoiceStream, event
from serve_app.config import AppConfig, model_deployment_name
from serve_app.engine.transient import TRANSIENT, cancel_call
from serve_app.engine.wire import (
    AdapterUnavailable,
    EngineRequest,
    EngineResult,
    EngineUnavailable,
    Late,
    QueueTimeout,
    routed,
)
from serve_app.errors import APIError, error_envelope, invalid, not_ready, overloaded
from serve_app.observe.availability import ReplicaStates
from serve_app.observe.request_log import RequestRecord

# How often a request waiting for its model checks that the model still has a replica.
LOST_CHECK_S = 0.5
# What a replica call may fail with that the client gets as an API error (the others: 500).
REFUSED = (*TRANSIENT, AdapterUnavailable)

logger = logging.getLogger("probserve.ingress")


class Readiness(enum.Enum):
    """A model's state on /health."""

    READY = "ready"
    SCALED_TO_ZERO = "scaled to zero"  # its next request starts a replica
    NO_RUNNING_REPLICA = "no running replica"
    NO_ANSWER = "no answer"  # its health check took longer than the bound
    UNHEALTHY = "unhealthy"  # its health check failed (its engine's)


@dataclasses.dataclass(frozen=True)
class ModelState:
    readiness: Readiness
    detail: str = ""  # what /health says in place of the state's name, where there is more

    @property
    def serving(self) -> bool:
        return self.readiness in (Readiness.READY, Readiness.SCALED_TO_ZERO)

    def text(self) -> str:
        return self.detail or self.readiness.value


class ReplicaClient:
    def __init__(self, config: AppConfig, replicas: dict[str, DeploymentHandle],
                 replica_states: ReplicaStates):
        self.config = config
        self.replicas = replicas
        self.replica_states = replica_states
        self.retry_after_s = config.ingress.retry_after_s

    async def generate(self, model: str, engine_requests: list[EngineRequest]) -> list[EngineResult]:
        """The results; 503 if the model's queue is full or it loses its replicas meanwhile."""
        await self.check_started(model)
        try:
            return await self.watched(model, generate_all(self.replicas[model], engine_requests))
        except REFUSED as error:
            raise self.refusal(error) from None

    async def full_vocab_windows(self, model: str,
                                 engine_request: EngineRequest) -> AsyncIterator[EngineResult]:
        """A full-vocabulary prompt's windows as its replica computes them, each chunk of
        rows a reference into Ray's object store, never fetched here (the replica's
        `generate_full_vocab`); stopped there if left early; refusals as `generate`'s."""
        await self.check_started(model)
        sent = dataclasses.replace(engine_request, sent_at=time.time())
        replica = routed(self.replicas[model], sent)
        call = replica.options(stream=True, _by_reference=True).generate_full_vocab.remote(sent)
        try:
            items = await self.watched(model, call._to_object_ref_gen())
            while (window := await self.next_window(model, items)) is not None:
                yield window
        except REFUSED as error:
            raise self.refusal(error) from None
        finally:
            cancel_call(call)

    async def next_window(self, model: str, items: AsyncIterator) -> EngineResult | None:
        """The next window's result with its chunks' references, or None after the last."""
        try:
            window = await self.watched(model, await self.watched(model, anext(items)))
        except StopAsyncIteration:
            return None
        chunks = [await self.watched(model, anext(items)) for _ in window.full_vocab.sizes]
        return dataclasses.replace(window, full_vocab=window.full_vocab.with_chunks(chunks))

    async def watched(self, model: str, awaitable: Awaitable):
        """`awaitable`'s result, the model checked for a running replica while it waits
        (cancelled if it has none)."""
        call = asyncio.ensure_future(awaitable)
        try:
            while not (await asyncio.wait({call}, timeout=LOST_CHECK_S))[0]:
                self.check_running(model)
            return call.result()
        finally:
            call.cancel()

    async def events(self, model: str, engine_requests: list[EngineRequest], record: RequestRecord,
                     stream: ChoiceStream) -> AsyncIterator[bytes]:
        """Every prompt's deltas as they come, merged into one event stream. A failure before
        the first event is the client's HTTP error; after it, the stream's last event."""
        await self.check_started(model)
        queue: asyncio.Queue = asyncio.Queue()
        tasks = [asyncio.create_task(self.pump(model, i, r, record, queue))
                 for i, r in enumerate(engine_requests)]
        done = asyncio.gather(*tasks)
        started = False
        try:
            while not (done.done() and queue.empty()):
                for chunk in await self.next_events(model, queue, done, stream):
                    started = True
                    yield chunk
            done.result()
        except Exception as error:
            error = self.refusal(error)
            if not started:
                raise error from None
            failure = stream_failure(error)
            record.code = failure["error"]["code"]
            yield event(failure)
        finally:
            record.generated_tokens = stream.completion_tokens
            for task in tasks:
                task.cancel()
        for chunk in stream.closing_events():
            yield chunk

    async def pump(self, model: str, prompt_index: int, engine_request: EngineRequest,
                   record: RequestRecord, queue: asyncio.Queue) -> None:
        """One prompt's deltas into the shared queue."""
        sent = dataclasses.replace(engine_request, sent_at=time.time())
        replica = routed(self.replicas[model], sent)
        async for delta in replica.options(stream=True).generate_stream.remote(sent):
            if delta.queue_time_s is not None:
                record.queue_time_s = max(record.queue_time_s or 0.0, delta.queue_time_s)
            await queue.put((prompt_index, delta))

    async def next_events(self, model: str, queue: asyncio.Queue, done: asyncio.Future,
                          stream: ChoiceStream) -> list[bytes]:
        """The events of the next delta, or none when none came within the check interval
        (the model still having a replica is checked then) or all are done."""
        getter = asyncio.ensure_future(queue.get())
        await asyncio.wait([getter, done], timeout=LOST_CHECK_S, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            return stream.events(*getter.result())
        getter.cancel()
        self.check_running(model)
        return []

    async def readiness(self, name: str) -> ModelState:
        """The model's health check (its engine's) within the bound. A model without replicas
        is not asked: asking would wait for one, and wake a model scaled to zero."""
        if await self.replica_states.known(model_deployment_name(name)) == 0:
            always_on = self.always_on(name)
            return ModelState(Readiness.NO_RUNNING_REPLICA if always_on else Readiness.SCALED_TO_ZERO)
        timeout_s = self.config.ingress.readiness_timeout_s
        try:
            await asyncio.wait_for(self.replicas[name].check_health.remote(), timeout_s)
        except TimeoutError:
            return ModelState(Readiness.NO_ANSWER, f"no answer within {timeout_s} s")
        except Exception as error:
            return ModelState(Readiness.UNHEALTHY, f"{type(error).__name__}: {error}")
        return ModelState(Readiness.READY)

    def always_on(self, name: str) -> bool:
        """Whether the model should always have a replica (it does not scale to zero)."""
        return self.config.model(name).autoscaling_config.get("min_replicas", 1) >= 1

    async def check_started(self, name: str) -> None:
        """`check_running` before a request is sent, a count of none confirmed by one at most
        a second old: an idle ingress's last count may date from before a replica started."""
        deployment = model_deployment_name(name)
        if self.always_on(name) and self.replica_states.running(deployment) == 0:
            await self.replica_states.known(deployment)
            self.check_running(name)

    def check_running(self, name: str) -> None:
        """503 `not_ready` at once for a model that should have a replica and has none,
        instead of waiting for one to start."""
        if self.always_on(name) and self.replica_states.running(model_deployment_name(name)) == 0:
            raise not_ready(f"model {name!r} has no running replica: Ray Serve is starting one",
                            self.retry_after_s)

    def refusal(self, error: Exception) -> Exception:
        """A model's full queue (or one waited in too long), dead engine or lost replica, as
        the client's 503; other errors as they are."""
        if isinstance(error, BackPressureError):
            return overloaded("the model's queue is full (max_queued_requests): retry later",
                              self.retry_after_s)
        # Over Ray's task path the replica's exception comes wrapped, its text a traceback.
        message = str(getattr(error, "cause", error))
        if isinstance(error, QueueTimeout):
            return overloaded(message, self.retry_after_s)
        if isinstance(error, Late):
            return overloaded(message, math.ceil(max(getattr(error, "cause", error).retry_after_s, 1)))
        if isinstance(error, EngineUnavailable):
            return not_ready(message, self.retry_after_s)
        if isinstance(error, AdapterUnavailable):
            return invalid("model", message, "adapter_not_found")
        if isinstance(error, RayActorError):
            return not_ready("the model's replica was lost (its process or node died): Ray Serve "
                             f"is replacing it ({type(error).__name__})", self.retry_after_s)
        return error


async def generate_all(replica: DeploymentHandle, engine_requests: list[EngineRequest]) -> list:
    """Every prompt's engine request, sent at once: the replica batches them. If one fails
    (its queue is full), the others are cancelled, which aborts them in the engine.

    Over Ray Serve's gRPC path rather than its task path (`_by_reference=False`): a result is
    small, and that path costs the ingress and the replica less CPU a request
    (docs/benchmarks.md#shipped-settings-measured). A lost replica is then
    `ActorUnavailableError`, a `RayActorError`."""
    sent_at = time.time()
    calls = [asyncio.ensure_future(routed(replica, r).options(_by_reference=False).generate.remote(
        dataclasses.replace(r, sent_at=sent_at))) for r in engine_requests]
    try:
        return await asyncio.gather(*calls)
    except BaseException:
        for call in calls:
            call.cancel()
        raise


def stream_failure(error: Exception) -> dict:
    """The error event of a stream that has started."""
    if isinstance(error, APIError):
        return error.envelope()
    logger.exception("stream failed", exc_info=error)
    return error_envelope(500, "internal_error", f"the stream failed: {error}")
