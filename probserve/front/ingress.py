"""Ingress: the HTTP front door. Each handler wires parse -> admit -> send -> shape: the body
parsed strictly for the caller's tenant (probserve.api.request_models), every check and the
engine requests (probserve.api.admission), the model replicas (probserve.front.replica_client),
the response (probserve.api.completions, chat, streaming; probserve.front.full_vocab).

Nothing invalid reaches a model replica: every check runs before any replica call.
"""

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response, StreamingResponse
from ray import serve
from ray.serve.context import _get_global_client
from ray.serve.handle import DeploymentHandle

from probserve.api import admission, chat, completions, tokenize
from probserve.api.admission import Admitted
from probserve.api.model_list import model_card
from probserve.api.openapi import install_openapi
from probserve.api.request_models import (
    DETOKENIZE_RULES,
    TOKENIZE_RULES,
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    StrictRequest,
    TokenizeRequest,
    parse_request,
)
from probserve.api.streaming import ChatStream, ChoiceStream, CompletionStream
from probserve.config import AppConfig, Capabilities, ModelConfig
from probserve.engine.wire import ONLINE, Caller, EngineResult
from probserve.errors import APIError, invalid, not_ready
from probserve.front.batch_api import BatchAPI
from probserve.front.full_vocab import FullVocabResponses, check_form, record_results
from probserve.front.http import event_stream, install_error_handlers, json_object, json_response
from probserve.front.replica_client import ReplicaClient
from probserve.front.viewer import ViewerFiles
from probserve.fullvocab.streamed import StreamedRows
from probserve.gate import once
from probserve.observe.availability import ReplicaStates, running_replicas
from probserve.observe.metrics import RequestObserver
from probserve.observe.request_log import ObservedRequests, RequestRecord, observed
from probserve.tenants.access import Access
from probserve.tenants.keyring import UNLIMITED, Tenant
from probserve.tenants.usage import usage_body
from probserve.text.vocabulary import Vocabulary

# No /docs or /redoc: their pages load scripts from a CDN, which clusters often cannot reach;
# /openapi.json is the contract, for any OpenAPI viewer.
app = FastAPI(title="probserve", summary="Log-probabilities of text, OpenAI-compatible",
              docs_url=None, redoc_url=None)
install_openapi(app)
install_error_handlers(app)
# Before the Ingress class: Ray Serve freezes the app when it decorates the class.
OBSERVER = RequestObserver()
app.add_middleware(ObservedRequests, observer=OBSERVER)


@dataclass(frozen=True)
class Call:
    """A parsed request: the caller's tenant, the body, its model with the vocabulary and the
    capabilities as this tenant has them, and what the request log will say of it."""

    tenant: Tenant
    body: StrictRequest
    model: ModelConfig
    vocab: Vocabulary
    caps: Capabilities
    record: RequestRecord
    priority: int = ONLINE  # the engine's scheduling priority (a batch line's: BatchConfig.priority)

    @property
    def caller(self) -> Caller:
        return Caller(self.record.tenant, self.priority)


def serve_details() -> dict:
    """The Serve controller's details of its applications, as `serve.status()` asks for them,
    without the models it builds of them: those pickle each deployment's request router class
    again, which in a process that has imported this much is most of the call's CPU
    (docs/benchmarks.md)."""
    return _get_global_client().get_serve_details()


def record_of(request: Request) -> RequestRecord:
    """What the request log and the metrics will say of this request (observe.request_log)."""
    return request.state.record


def fits_a_batch(body: CompletionRequest | ChatRequest) -> None:
    """A batch line's answer is one line of its output file."""
    if body.stream:
        raise invalid("stream", "a batch line cannot stream: its answer is one line of the output "
                      "file; leave stream out", "invalid_batch_line")
    if getattr(body, "prompt_logprobs", None) == -1:
        raise invalid("prompt_logprobs", "the full vocabulary (prompt_logprobs: -1) is not offered in "
                      "a batch: send it to /v1/completions online", "invalid_batch_line")


def batch_answer(record: RequestRecord, status: int, body: dict, retry_after: str | None = None) -> dict:
    record.status = status
    return {"status": status, "body": body, "request_id": record.request_id,
            "retry_after": int(retry_after) if retry_after else None}


@serve.deployment
@serve.ingress(app)
class Ingress:
    def __init__(self, config: AppConfig, replicas: dict[str, DeploymentHandle],
                 serializers: DeploymentHandle, batch_runner: DeploymentHandle):
        self.config = config
        self.vocabularies = {m.name: Vocabulary.load(m.resolved_path()) for m in config.models}
        self.created = int(time.time())
        self.access = Access(config.tenancy, config.ingress.retry_after_s)
        app_name = serve.get_replica_context().app_name
        states = ReplicaStates(lambda: running_replicas(serve_details(), app_name))
        self.engines = ReplicaClient(config, replicas, states)
        self.full_vocab = FullVocabResponses(config, serializers)
        self.viewer = ViewerFiles(config.ingress.ui)
        self.batch = BatchAPI(config.batch, config.ingress.max_body_bytes, batch_runner)

    @app.get("/livez")
    async def live(self) -> Response:
        """Liveness: this ingress replica answers. It asks no model: a model that is down must
        not get the ingress restarted."""
        return json_response({"status": "ok"})

    @app.get("/health")
    async def health(self, model: str | None = None) -> Response:
        """Readiness of every model, or of one (`?model=`): 200 when ready, else 503
        `not_ready` naming the models that are not, with each model's state."""
        names = [self.model(model).name] if model is not None else [m.name for m in self.config.models]
        states = dict(zip(names, await asyncio.gather(*map(self.engines.readiness, names)), strict=True))
        shown = {name: state.text() for name, state in states.items()}
        down = ", ".join(name for name, state in states.items() if not state.serving)
        if not down:
            return json_response({"status": "ok", "models": shown})
        error = not_ready(f"not ready: {down}", self.config.ingress.retry_after_s)
        return json_response({**error.envelope(), "models": shown}, error.status, error.headers)

    @app.get("/ui", include_in_schema=False)
    async def viewer_folder(self) -> Response:
        """The viewer's folder, so that the page's relative paths resolve under any route prefix."""
        self.viewer.check_enabled()
        return RedirectResponse("ui/", status_code=307)

    @app.get("/ui/", include_in_schema=False)
    async def viewer_page(self) -> Response:
        """The token-probability viewer (probserve.front.viewer)."""
        return self.viewer.response("index.html")

    @app.get("/ui/{name}", include_in_schema=False)
    async def viewer_file(self, name: str) -> Response:
        return self.viewer.response(name)

    @app.get("/v1/models")
    async def models(self, request: Request) -> Response:
        """The models the caller's tenant may use, with its caps."""
        tenant = await self.tenant(request)
        cards = [model_card(m, tenant.capabilities(m.capabilities), self.created, self.vocabularies[m.name])
                 for m in self.config.models if tenant.allows(m.name)]
        return json_response({"object": "list", "data": cards})

    @app.get("/v1/usage")
    async def usage(self, request: Request) -> Response:
        """The caller's tenant's usage (probserve.tenants.usage)."""
        await self.tenant(request)
        name = record_of(request).tenant
        return json_response(usage_body(name, await self.access.stored_usage(name)))

    @app.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        call = await self.parse(request, CompletionRequest, self.completion_rules)
        check_form(request, full_vocab=call.body.prompt_logprobs == -1)
        admitted = await self.admit_completion(call)
        if call.body.stream:
            return await self.stream(call, admitted, CompletionStream)
        if call.body.prompt_logprobs == -1:
            return await self.full_vocab_response(request, call, admitted)
        return json_response(await self.completion_body(call, admitted))

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        call = await self.parse(request, ChatRequest, self.chat_rules)
        check_form(request, full_vocab=call.body.prompt_logprobs == -1)
        admitted = await self.admit_chat(call)
        if call.body.stream:
            return await self.stream(call, admitted, ChatStream)
        if call.body.prompt_logprobs == -1:
            return await self.full_vocab_response(request, call, admitted)
        return json_response(await self.chat_body(call, admitted))

    async def batch_line(self, tenant_name: str, endpoint: str, body: dict) -> dict:
        """One request line of a batch (probserve.batch.runner) for its tenant, through the
        endpoint's own parse, admission and charge: its status, answer or refusal's envelope,
        request id and the wait a refusal names."""
        record = RequestRecord(request_id=uuid.uuid4().hex, method="POST", endpoint=f"batch {endpoint}")
        with observed(record, OBSERVER):
            try:
                tenant = await self.access.admit_named(tenant_name, record)
                if endpoint == "/v1/completions":
                    call = self.batch_call(tenant, record, body, CompletionRequest, self.completion_rules)
                    answer = await self.completion_body(call, await self.admit_completion(call))
                else:
                    call = self.batch_call(tenant, record, body, ChatRequest, self.chat_rules)
                    answer = await self.chat_body(call, await self.admit_chat(call))
                return batch_answer(record, 200, answer)
            except APIError as error:
                record.code = error.code
                retry_after = (error.headers or {}).get("Retry-After")
                return batch_answer(record, error.status, error.envelope(), retry_after)

    def app_config(self) -> AppConfig:
        """The configuration this ingress runs (dataset scoring admits documents by it)."""
        return self.config

    @app.post("/v1/files")
    async def upload_file(self, request: Request) -> Response:
        return await self.batch.upload(request, await self.tenant_name(request))

    @app.get("/v1/files")
    async def list_files(self, request: Request, purpose: str | None = None) -> Response:
        return await asyncio.to_thread(self.batch.files, await self.tenant_name(request), purpose)

    @app.get("/v1/files/{file_id}")
    async def get_file(self, request: Request, file_id: str) -> Response:
        return await asyncio.to_thread(self.batch.file, await self.tenant_name(request), file_id)

    @app.get("/v1/files/{file_id}/content")
    async def file_content(self, request: Request, file_id: str) -> Response:
        return await asyncio.to_thread(self.batch.content, await self.tenant_name(request), file_id)

    @app.delete("/v1/files/{file_id}")
    async def delete_file(self, request: Request, file_id: str) -> Response:
        return await asyncio.to_thread(self.batch.delete, await self.tenant_name(request), file_id)

    @app.post("/v1/batches")
    async def create_batch(self, request: Request) -> Response:
        return await self.batch.create(request, await self.tenant_name(request))

    @app.get("/v1/batches")
    async def list_batches(self, request: Request, after: str | None = None, limit: int = 20) -> Response:
        return await asyncio.to_thread(self.batch.batches, await self.tenant_name(request), after, limit)

    @app.get("/v1/batches/{batch_id}")
    async def get_batch(self, request: Request, batch_id: str) -> Response:
        return await asyncio.to_thread(self.batch.batch, await self.tenant_name(request), batch_id)

    @app.post("/v1/batches/{batch_id}/cancel")
    async def cancel_batch(self, request: Request, batch_id: str) -> Response:
        return await self.batch.cancel(await self.tenant_name(request), batch_id)

    @app.get("/tokenizer_info")
    async def tokenizer_info(self, request: Request, model: str | None = None) -> Response:
        """The tokenizer's configuration in vLLM's shape, of `?model=` or the caller's only
        model (probserve.api.tokenize)."""
        tenant = await self.tenant(request)
        chosen = self.model(model if model is not None else self.only_model(tenant), tenant)
        record_of(request).model = chosen.name
        max_model_len = tenant.capabilities(chosen.capabilities).max_model_len
        return json_response(tokenize.tokenizer_info(self.vocabularies[chosen.name], max_model_len))

    @app.post("/tokenize")
    async def tokenize(self, request: Request) -> Response:
        call = await self.parse(request, TokenizeRequest, lambda _: TOKENIZE_RULES, model_optional=True)
        return json_response(tokenize.tokenize_response(call.body, call.vocab, call.caps.max_model_len))

    @app.post("/detokenize")
    async def detokenize(self, request: Request) -> Response:
        call = await self.parse(request, DetokenizeRequest, lambda _: DETOKENIZE_RULES, model_optional=True)
        return json_response({"prompt": tokenize.detokenize(call.body, call.vocab)})

    def model(self, name: str, tenant: Tenant = UNLIMITED) -> ModelConfig:
        """The model, if it exists and the tenant may use it: else 404, the same either way,
        naming only the tenant's models."""
        model = self.config.model(name)
        if model is None or not tenant.allows(name):
            known = ", ".join(m.name for m in self.config.models if tenant.allows(m.name)) or "none"
            raise APIError(404, "model_not_found", f"model {name!r} does not exist; "
                           f"this service has: {known}", "model")
        return model

    def only_model(self, tenant: Tenant) -> str:
        """The model a request that names none is for: the tenant's only one (as vLLM's
        tokenizer endpoints default to the model they serve)."""
        names = [m.name for m in self.config.models if tenant.allows(m.name)]
        if len(names) != 1:
            raise invalid("model", f"model is required: there are {len(names)} models to choose from "
                          f"({', '.join(names) or 'none'})")
        return names[0]

    async def tenant(self, request: Request) -> Tenant:
        """Authenticated and within its request rate and in-flight bound, else 401 or 429."""
        return await self.access.admit(request.headers.get("authorization"), record_of(request))

    async def tenant_name(self, request: Request) -> str:
        await self.tenant(request)
        return record_of(request).tenant

    def completion_rules(self, caps: Capabilities | None) -> dict[str, str]:
        return admission.rules(caps, self.config.ingress)

    def chat_rules(self, caps: Capabilities | None) -> dict[str, str]:
        return admission.rules(caps, self.config.ingress, chat=True)

    async def parse(self, request: Request, kind: type[StrictRequest],
                    rules: Callable[[Capabilities | None], dict[str, str]],
                    model_optional: bool = False) -> Call:
        """The caller's tenant, then its body (`call`); with `model_optional`, a body that names
        no model is for the tenant's only one."""
        tenant, record = await self.tenant(request), record_of(request)
        raw = await json_object(request, self.config.ingress.max_body_bytes)
        if model_optional and "model" not in raw:
            raw = {**raw, "model": self.only_model(tenant)}
        return self.call(tenant, record, raw, kind, rules)

    def call(self, tenant: Tenant, record: RequestRecord, raw: dict, kind: type[StrictRequest],
             rules: Callable[[Capabilities | None], dict[str, str]]) -> Call:
        """The body parsed strictly for its tenant, with the field rules of its model as this
        tenant has it (the model is recorded even if the rest is refused)."""
        named = self.config.model(raw["model"]) if isinstance(raw.get("model"), str) else None
        named = named if named and tenant.allows(named.name) else None
        if named:
            record.model = named.name
        body = parse_request(kind, raw, rules(tenant.capabilities(named.capabilities) if named else None))
        model = self.model(body.model, tenant)
        return Call(tenant, body, model, self.vocabularies[model.name],
                    tenant.capabilities(model.capabilities), record)

    def batch_call(self, tenant: Tenant, record: RequestRecord, raw: dict, kind: type[StrictRequest],
                   rules: Callable[[Capabilities | None], dict[str, str]]) -> Call:
        """A batch line's call: as online, at the batch's priority."""
        call = self.call(tenant, record, raw, kind, rules)
        fits_a_batch(call.body)
        return dataclasses.replace(call, priority=self.config.batch.priority)

    async def admit_completion(self, call: Call) -> Admitted:
        admitted = admission.admit_completion(call.body, call.caps, self.config.ingress, call.vocab,
                                              call.caller)
        await self.charge(call, admitted)
        return admitted

    async def admit_chat(self, call: Call) -> Admitted:
        admitted = admission.admit_chat(call.body, call.caps, self.config.ingress, call.vocab, call.caller)
        await self.charge(call, admitted)
        return admitted

    async def completion_body(self, call: Call, admitted: Admitted) -> dict:
        results = await self.send(call, admitted)
        return completions.completion_response(call.model.name, admitted.prompts, results, call.body,
                                               call.vocab)

    async def chat_body(self, call: Call, admitted: Admitted) -> dict:
        (result,) = await self.send(call, admitted)
        return chat.chat_response(call.model.name, admitted, result, call.body, call.vocab)

    async def charge(self, call: Call, admitted: Admitted) -> None:
        """The request's prompt tokens, recorded and charged to its tenant's rate."""
        call.record.prompt_tokens, call.record.scored_tokens = admitted.prompt_tokens, admitted.scored_tokens
        await self.access.charge_prompt(call.tenant, call.record, admitted.full_vocab_positions)

    async def send(self, call: Call, admitted: Admitted) -> list[EngineResult]:
        results = await self.engines.generate(call.model.name, admitted.engine_requests)
        record_results(call.record, results, call.body.n)
        return results

    async def stream(self, call: Call, admitted: Admitted, kind: type[ChoiceStream]) -> StreamingResponse:
        stream = kind(call.model.name, call.body, admitted.prompts, call.vocab)
        return await event_stream(self.engines.events(call.model.name, admitted.engine_requests,
                                                      call.record, stream))

    async def full_vocab_response(self, request: Request, call: Call,
                                  admitted: Admitted) -> StreamingResponse:
        """prompt_logprobs -1: the whole distributions, streamed; a bounded number at once, in
        all and per tenant."""
        release = await self.full_vocab_places(call)
        try:
            prompts = [StreamedRows(self.engines.full_vocab_windows(call.model.name, r))
                       for r in admitted.engine_requests]
            await prompts[0].first()
            return self.full_vocab.body(request, call.model.name, call.vocab, call.body, admitted,
                                        prompts, release, call.record)
        except BaseException:
            release()
            raise

    async def full_vocab_places(self, call: Call) -> Callable[[], None]:
        """A place among the tenant's full-vocabulary requests, then one of this replica's
        slots; returns the release of both."""
        with ExitStack() as undo:
            tenant_place = await self.access.full_vocab_place(call.tenant, call.record)
            undo.callback(tenant_place)
            slot = await self.full_vocab.slot()
            undo.pop_all()
        return once(lambda: (slot(), tenant_place()))
