"""Ingress: the HTTP front door. Parses and checks every request, tokenizes, routes by `model`.

Nothing invalid reaches a model replica: every check runs here, before any replica call.
"""

import asyncio
import dataclasses
import functools
import logging
import time
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle, DeploymentResponse
from starlette.exceptions import HTTPException

from serve_app import admission, chat, completions, npy, tokenizer
from serve_app.access import Access
from serve_app.availability import ReplicaStates, running_replicas
from serve_app.compression import accepts_gzip
from serve_app.config import AppConfig, Capabilities, ModelConfig, model_deployment_name
from serve_app.errors import APIError, EngineUnavailable, error_envelope, not_ready, overloaded
from serve_app.metrics import HeldGauge, IngressMetrics
from serve_app.openapi import install_openapi
from serve_app.protocol import (
    DETOKENIZE_RULES,
    TOKENIZE_RULES,
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    StrictRequest,
    TokenizeRequest,
    parse_request,
)
from serve_app.relay import full_vocab_body
from serve_app.streaming import ChatStream, ChoiceStream, CompletionStream, event
from serve_app.telemetry import ObservedRequests, RequestRecord, request_logger
from serve_app.tenancy import UNLIMITED, Tenant
from serve_app.usage import usage_body
from serve_app.vocabulary import Vocabulary

# How often a request waiting for its model checks that the model still has a replica.
LOST_CHECK_S = 0.5
# /health's model states that count as serving.
SERVING = ("ready", "scaled to zero")

logger = logging.getLogger("probserve.ingress")
# No /docs or /redoc: their pages load scripts from a CDN, which clusters often cannot reach;
# /openapi.json is the contract, for any OpenAPI viewer.
app = FastAPI(title="probserve", summary="Log-probabilities of text, OpenAI-compatible",
              docs_url=None, redoc_url=None)
install_openapi(app)


class RequestObserver:
    """Each request into the ingress's metrics and the request log, both made on first use:
    in the Ingress replica's process, whose metrics Ray exports and whose stderr it keeps."""

    @functools.cached_property
    def metrics(self) -> IngressMetrics:
        return IngressMetrics()

    @functools.cached_property
    def log(self) -> logging.Logger:
        return request_logger()

    def started(self, record: RequestRecord) -> None:
        self.metrics.started(record)

    def finished(self, record: RequestRecord) -> None:
        self.metrics.finished(record)
        self.log.info(record.log_line().decode())


observer = RequestObserver()
# Before the Ingress class: Ray Serve freezes the app when it decorates the class.
app.add_middleware(ObservedRequests, observer=observer)

HTTP_ERROR_CODES = {404: "not_found", 405: "method_not_allowed"}


def json_response(body: dict, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json",
                    headers=headers)


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


def once(action: Callable[[], None]) -> Callable[[], None]:
    done = False

    def run() -> None:
        nonlocal done
        if not done:
            done = True
            action()
    return run


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


async def event_stream(events: AsyncIterator[bytes]) -> StreamingResponse:
    """Server-sent events, once the first is ready: a request refused before it (the model's
    queue is full) still gets its HTTP status instead of a 200 stream."""
    first = await anext(events)

    async def all_events() -> AsyncIterator[bytes]:
        yield first
        async for chunk in events:
            yield chunk
    return StreamingResponse(all_events(), media_type="text/event-stream")


def streaming_body(chunks: AsyncIterator[bytes], media_type: str, gzip: bool,
                   release: Callable[[], None], record: RequestRecord) -> StreamingResponse:
    """A large body, sent as it is written."""
    body = released_after(chunks, release, record)
    weakref.finalize(body, release)  # a body never started (the client left) releases too
    headers = {"Content-Encoding": "gzip"} if gzip else {}
    return StreamingResponse(body, media_type=media_type,
                             headers={**headers, "Vary": "Accept, Accept-Encoding"})


def check_form(request: Request, full_vocab: bool) -> None:
    """The binary form exists for the full vocabulary only."""
    if npy.accepts_npy(request.headers.get("accept")) and not full_vocab:
        raise APIError(406, "not_acceptable", f"{npy.MEDIA_TYPE} is the form of "
                       "`prompt_logprobs: -1` on /v1/completions only; accept application/json")


async def generate_all(replica: DeploymentHandle, engine_requests: list) -> list:
    """Every prompt's engine request, sent at once: the replica batches them. If one fails
    (its queue is full), the others are cancelled, which aborts them in the engine."""
    sent_at = time.time()
    calls = [asyncio.ensure_future(replica.generate.remote(dataclasses.replace(r, sent_at=sent_at)))
             for r in engine_requests]
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


def record_of(request: Request) -> RequestRecord:
    """What the request log and the metrics will say of this request (serve_app.telemetry)."""
    return request.state.record


def note_prompts(request: Request, prompts: list, scored_tokens: int = 0) -> None:
    record = record_of(request)
    record.prompt_tokens = sum(len(p.token_ids) for p in prompts)
    record.scored_tokens = scored_tokens


def note_results(record: RequestRecord, results: list, n: int) -> None:
    record.generated_tokens = completions.completion_tokens(results, n)
    waits = [r.queue_time_s for r in results if r.queue_time_s is not None]
    record.queue_time_s = max(waits, default=None)


def model_card(model: ModelConfig, caps: Capabilities, created: int, vocab: Vocabulary) -> dict:
    return {
        "id": model.name,
        "object": "model",
        "created": created,
        "owned_by": "probserve",
        "max_model_len": caps.max_model_len,
        # Whether /v1/chat/completions serves it: its tokenizer has a chat template.
        "chat": vocab.chat_template is not None,
        "capabilities": caps.model_dump(),
    }


@serve.deployment
@serve.ingress(app)
class Ingress:
    def __init__(self, config: AppConfig, replicas: dict[str, DeploymentHandle],
                 serializers: DeploymentHandle):
        self.config = config
        self.replicas = replicas
        self.serializers = serializers
        self.vocabularies = {m.name: Vocabulary.load(m.resolved_path()) for m in config.models}
        self.created = int(time.time())
        self.full_vocab_slots = asyncio.Semaphore(config.ingress.max_full_vocab_requests)
        self.waiting = HeldGauge("probserve_full_vocab_waiting")
        self.access = Access(config.tenancy, config.ingress.retry_after_s)
        app_name = serve.get_replica_context().app_name
        self.replica_states = ReplicaStates(lambda: running_replicas(serve.status(), app_name))

    def model(self, name: str, tenant: Tenant = UNLIMITED) -> ModelConfig:
        """The model, if it exists and the tenant may use it: else 404, the same either way,
        naming only the tenant's models."""
        model = self.config.model(name)
        if model is None or not tenant.allows(name):
            known = ", ".join(m.name for m in self.config.models if tenant.allows(m.name)) or "none"
            raise APIError(404, "model_not_found", f"model {name!r} does not exist; "
                           f"this service has: {known}", "model")
        return model

    async def tenant(self, request: Request) -> Tenant:
        """Authenticated and within its request rate and in-flight bound, else 401 or 429."""
        return await self.access.admit(request.headers.get("authorization"), record_of(request))

    @app.get("/livez")
    async def live(self) -> Response:
        """Liveness: this ingress replica answers. It asks no model: a model that is down must
        not get the ingress restarted."""
        return json_response({"status": "ok"})

    @app.get("/health")
    async def health(self, model: str | None = None) -> Response:
        """Readiness of every model, or of one (`?model=`): 200 when ready, else 503
        `not_ready` naming the models that are not, with each model's state."""
        names = [self.model(model).name] if model is not None else list(self.replicas)
        states = dict(zip(names, await asyncio.gather(*map(self.readiness, names))))
        if all(state in SERVING for state in states.values()):
            return json_response({"status": "ok", "models": states})
        down = ", ".join(name for name, state in states.items() if state not in SERVING)
        error = not_ready(f"not ready: {down}", self.config.ingress.retry_after_s)
        return json_response({**error.envelope(), "models": states}, error.status, error.headers)

    async def readiness(self, name: str) -> str:
        """"ready", "scaled to zero" (its next request starts a replica), or why not: the
        model's health check (its engine's) within the bound. A model without replicas is not
        asked: asking would wait for one, and wake a model scaled to zero."""
        if self.replica_states.running(model_deployment_name(name)) == 0:
            return "no running replica" if self.always_on(name) else "scaled to zero"
        try:
            await asyncio.wait_for(self.replicas[name].check_health.remote(),
                                   self.config.ingress.readiness_timeout_s)
        except TimeoutError:
            return f"no answer within {self.config.ingress.readiness_timeout_s} s"
        except Exception as error:
            return f"{type(error).__name__}: {error}"
        return "ready"

    @app.get("/v1/models")
    async def models(self, request: Request) -> Response:
        """The models the caller's tenant may use, with its caps."""
        tenant = await self.tenant(request)
        cards = [model_card(m, tenant.capabilities(m.capabilities), self.created, self.vocabularies[m.name])
                 for m in self.config.models if tenant.allows(m.name)]
        return json_response({"object": "list", "data": cards})

    @app.get("/v1/usage")
    async def usage(self, request: Request) -> Response:
        """The caller's tenant's usage (serve_app.usage)."""
        await self.tenant(request)
        name = record_of(request).tenant
        try:
            stored = await self.access.usage.read(name)
        except Exception as error:
            raise APIError(503, "usage_unavailable", f"the usage storage cannot be reached: {error}",
                           headers={"Retry-After": str(self.config.ingress.retry_after_s)}) from None
        return json_response(usage_body(name, stored))

    async def parse(self, request: Request, kind: type[StrictRequest],
                    rules: Callable[[Capabilities | None], dict[str, str]]) -> tuple:
        """The caller's tenant; the body parsed strictly; its model's config, vocabulary and
        capabilities as this tenant has them."""
        tenant = await self.tenant(request)
        raw = await json_object(request, self.config.ingress.max_body_bytes)
        named = self.config.model(raw["model"]) if isinstance(raw.get("model"), str) else None
        named = named if named and tenant.allows(named.name) else None
        if named:  # the request's model, even if the rest of it is refused
            record_of(request).model = named.name
        body = parse_request(kind, raw, rules(tenant.capabilities(named.capabilities) if named else None))
        model = self.model(body.model, tenant)
        return body, model, self.vocabularies[model.name], tenant

    @app.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        body, model, vocab, tenant = await self.parse(
            request, CompletionRequest, lambda caps: admission.rules(caps, self.config.ingress))
        check_form(request, body.prompt_logprobs == -1)
        caps = tenant.capabilities(model.capabilities)
        admission.check_completion(body, caps, self.config.ingress, vocab)
        bias = admission.logit_bias(body, vocab.logits_size)
        prompts = admission.prompt_inputs(body.prompt, vocab, self.config.ingress.max_batch_prompts)
        admission.check_prompts(prompts, body, caps)
        note_prompts(request, prompts, sum(admission.scored_prompt_tokens(body, len(p.token_ids))
                                           for p in prompts))
        full_vocab_positions = sum(len(p.token_ids) - 1 for p in prompts) if body.prompt_logprobs == -1 else 0
        await self.access.charge_prompt(tenant, record_of(request), full_vocab_positions)
        engine_requests = [admission.engine_request(p, body, caps, bias) for p in prompts]
        if body.stream:
            return await event_stream(self.events(model.name, engine_requests, record_of(request),
                                                  CompletionStream(model.name, body, prompts, vocab)))
        if body.prompt_logprobs == -1:
            return await self.full_vocab(request, body, model, tenant, prompts, engine_requests)
        results = await self.generate(model.name, engine_requests)
        note_results(record_of(request), results, body.n)
        return json_response(completions.completion_response(model.name, prompts, results, body, vocab))

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        body, model, vocab, tenant = await self.parse(
            request, ChatRequest, lambda caps: admission.rules(caps, self.config.ingress, chat=True))
        check_form(request, full_vocab=False)
        caps = tenant.capabilities(model.capabilities)
        admission.check_chat(body, caps, self.config.ingress, vocab)
        bias = admission.logit_bias(body, vocab.logits_size)
        prompt = admission.chat_prompt(body, vocab)
        admission.check_prompts([prompt], body, caps, "messages")
        note_prompts(request, [prompt])
        await self.access.charge_prompt(tenant, record_of(request), 0)
        engine_request = admission.engine_request(prompt, body, caps, bias)
        if body.stream:
            return await event_stream(self.events(model.name, [engine_request], record_of(request),
                                                  ChatStream(model.name, body, [prompt], vocab)))
        (result,) = await self.generate(model.name, [engine_request])
        note_results(record_of(request), [result], body.n)
        return json_response(chat.chat_response(model.name, prompt, result, body, vocab))

    @app.post("/tokenize")
    async def tokenize(self, request: Request) -> Response:
        body, model, vocab, _ = await self.parse(request, TokenizeRequest, lambda _: TOKENIZE_RULES)
        token_ids = tokenizer.tokenize(body, vocab)
        return json_response({"count": len(token_ids), "max_model_len": model.capabilities.max_model_len,
                              "tokens": token_ids})

    @app.post("/detokenize")
    async def detokenize(self, request: Request) -> Response:
        body, _, vocab, _ = await self.parse(request, DetokenizeRequest, lambda _: DETOKENIZE_RULES)
        return json_response({"prompt": tokenizer.detokenize(body, vocab)})

    async def full_vocab(self, request: Request, body: CompletionRequest, model: ModelConfig,
                         tenant: Tenant, prompts: list, engine_requests: list) -> StreamingResponse:
        """prompt_logprobs -1: the whole distributions, streamed; a bounded number at once, in
        all and per tenant."""
        record = record_of(request)
        release_tenant = await self.access.full_vocab_place(tenant, record)
        try:
            await self.full_vocab_slot()
        except BaseException:
            release_tenant()
            raise
        release = once(lambda: (self.full_vocab_slots.release(), release_tenant()))
        try:
            results = await self.generate(model.name, engine_requests)
            note_results(record, results, body.n)
            if npy.accepts_npy(request.headers.get("accept")):
                return self.npy_body(model, prompts, results, release, record)
            response = completions.completion_response(
                model.name, prompts, results, body, self.vocabularies[model.name])
            gzip = accepts_gzip(request.headers.get("accept-encoding"))

            def write(chunk) -> DeploymentResponse:
                return self.serializers.write.remote(model.name, [chunk], gzip)
            chunks = full_vocab_body(completions.body_parts(response, results), write,
                                     self.config.serializer_pool.window, gzip)
            return streaming_body(chunks, "application/json", gzip, release, record)
        except BaseException:
            release()
            raise

    def npy_body(self, model: ModelConfig, prompts: list, results: list,
                 release: Callable[[], None], record: RequestRecord) -> StreamingResponse:
        """The binary form: never gzip-encoded (float32 noise hardly compresses)."""
        parts = npy.body_parts([p.token_ids for p in prompts], results,
                               self.vocabularies[model.name].logits_size)

        def write(chunk: npy.NpyChunk) -> DeploymentResponse:
            return self.serializers.write_npy.remote(model.name, chunk)
        chunks = full_vocab_body(parts, write, self.config.serializer_pool.window, gzip=False)
        return streaming_body(chunks, npy.MEDIA_TYPE, False, release, record)

    def refusal(self, error: Exception) -> Exception:
        """A model's full queue, dead engine or lost replica, as the client's 503; other errors
        as they are."""
        retry_after_s = self.config.ingress.retry_after_s
        if isinstance(error, BackPressureError):
            return overloaded("the model's queue is full (max_queued_requests): retry later",
                              retry_after_s)
        if isinstance(error, EngineUnavailable):
            return not_ready(str(error), retry_after_s)
        if isinstance(error, RayActorError):
            return not_ready("the model's replica was lost (its process or node died): Ray Serve "
                             f"is replacing it ({type(error).__name__})", retry_after_s)
        return error

    def always_on(self, name: str) -> bool:
        """Whether the model should always have a replica (it does not scale to zero)."""
        return self.config.model(name).autoscaling_config.get("min_replicas", 1) >= 1

    def check_running(self, name: str) -> None:
        """503 `not_ready` at once for a model that should have a replica and has none
        (serve_app.availability), instead of waiting for one to start."""
        if self.always_on(name) and self.replica_states.running(model_deployment_name(name)) == 0:
            raise not_ready(f"model {name!r} has no running replica: Ray Serve is starting one",
                            self.config.ingress.retry_after_s)

    async def generate(self, model: str, engine_requests: list) -> list:
        """The results; 503 if the model's queue is full or it loses its replicas meanwhile
        (Ray Serve would hold the request until a new replica starts)."""
        self.check_running(model)
        call = asyncio.ensure_future(generate_all(self.replicas[model], engine_requests))
        try:
            while not (await asyncio.wait({call}, timeout=LOST_CHECK_S))[0]:
                self.check_running(model)
            return call.result()
        except (BackPressureError, EngineUnavailable, RayActorError) as error:
            raise self.refusal(error) from None
        finally:
            call.cancel()

    async def full_vocab_slot(self) -> None:
        """A slot, within the configured wait and number of waiters, else 503 `overloaded`."""
        limits = self.config.ingress
        busy = overloaded(f"all {limits.max_full_vocab_requests} full-vocabulary slots of this "
                          f"replica are busy and {limits.max_full_vocab_waiting} requests wait for "
                          "one: retry later", limits.retry_after_s)
        if self.full_vocab_slots.locked() and self.waiting.value >= limits.max_full_vocab_waiting:
            raise busy
        self.waiting.change(1)
        try:
            await asyncio.wait_for(self.full_vocab_slots.acquire(), limits.full_vocab_wait_s)
        except TimeoutError:
            raise busy from None
        finally:
            self.waiting.change(-1)

    async def events(self, model: str, engine_requests: list, record: RequestRecord,
                     stream: ChoiceStream) -> AsyncIterator[bytes]:
        """Every prompt's deltas as they come, merged into one event stream."""
        self.check_running(model)
        replica = self.replicas[model]
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(prompt_index: int, engine_request) -> None:
            sent = dataclasses.replace(engine_request, sent_at=time.time())
            async for delta in replica.options(stream=True).generate_stream.remote(sent):
                if delta.queue_time_s is not None:
                    record.queue_time_s = max(record.queue_time_s or 0.0, delta.queue_time_s)
                await queue.put((prompt_index, delta))

        tasks = [asyncio.create_task(pump(i, r)) for i, r in enumerate(engine_requests)]
        done = asyncio.gather(*tasks)
        started = False
        try:
            while not (done.done() and queue.empty()):
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait([getter, done], timeout=LOST_CHECK_S,
                                   return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    for chunk in stream.events(*getter.result()):
                        started = True
                        yield chunk
                else:
                    getter.cancel()
                    self.check_running(model)
            done.result()
        except Exception as error:
            error = self.refusal(error)
            if not started:  # nothing sent: the client gets the HTTP error
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

