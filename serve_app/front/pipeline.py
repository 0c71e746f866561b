"""The request pipeline behind the ingress's handlers: parse -> admit -> charge -> send ->
shape. The body parsed strictly for the caller's tenant (serve_app.api.request_models), every
check and the engine requests (serve_app.api.admission), the model replicas
(serve_app.front.replica_client), the response (serve_app.api.completions, chat, streaming;
serve_app.front.full_vocab). /v1/completions and /v1/chat/completions differ only in what
`Endpoint` names.

Nothing invalid reaches a model replica: every check runs before any replica call.
"""

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from serve_app.api import admission, chat, completions
from serve_app.api.admission import Admitted
from serve_app.api.request_models import ChatRequest, CompletionRequest, StrictRequest, parse_request
from serve_app.api.streaming import ChatStream, ChoiceStream, CompletionStream
from serve_app.config import AppConfig, Capabilities, ModelConfig, Served
from serve_app.engine.wire import ONLINE, Adapter, Caller, EngineResult
from serve_app.errors import invalid
from serve_app.front.catalog import Catalog
from serve_app.front.full_vocab import FullVocabResponses, check_form, record_results
from serve_app.front.http import event_stream, json_object, json_response
from serve_app.front.replica_client import ReplicaClient
from serve_app.fullvocab.streamed import StreamedRows
from serve_app.gate import once
from serve_app.observe.request_log import RequestRecord
from serve_app.tenants.access import Access
from serve_app.tenants.keyring import Tenant
from serve_app.text.vocabulary import Vocabulary

FieldRules = Callable[[Capabilities | None], dict[str, str]]


def completion_answer(model: str, admitted: Admitted, results: list[EngineResult],
                      body: CompletionRequest, vocab: Vocabulary) -> dict:
    return completions.completion_response(model, admitted.prompts, results, body, vocab)


def chat_answer(model: str, admitted: Admitted, results: list[EngineResult], body: ChatRequest,
                vocab: Vocabulary) -> dict:
    (result,) = results  # one conversation, one engine request
    return chat.chat_response(model, admitted, result, body, vocab)


@dataclass(frozen=True)
class Endpoint:
    """What one generating endpoint parses, admits, answers and streams with."""

    path: str
    request: type[CompletionRequest | ChatRequest]
    chat: bool  # the field rules of chat (serve_app.api.admission.rules)
    admit: Callable[..., Admitted]
    answer: Callable[..., dict]
    stream: type[ChoiceStream]


COMPLETIONS = Endpoint("/v1/completions", CompletionRequest, False, admission.admit_completion,
                       completion_answer, CompletionStream)
CHAT = Endpoint("/v1/chat/completions", ChatRequest, True, admission.admit_chat, chat_answer, ChatStream)
ENDPOINTS = {endpoint.path: endpoint for endpoint in (COMPLETIONS, CHAT)}


@dataclass(frozen=True)
class ParsedRequest:
    """A request parsed for its caller: the tenant, the body, its model (and the adapter it
    names) with the vocabulary and the capabilities as this tenant has them, and what the
    request log will say of it."""

    tenant: Tenant
    body: StrictRequest
    served: Served  # what the answer names; its model's replicas compute it
    vocab: Vocabulary
    caps: Capabilities
    record: RequestRecord
    priority: int = ONLINE  # the engine's scheduling priority (a batch line's: BatchConfig.priority)

    @property
    def model(self) -> ModelConfig:
        return self.served.model

    @property
    def caller(self) -> Caller:
        return Caller(self.record.tenant, self.priority, Adapter.of(self.served))


def record_of(request: Request) -> RequestRecord:
    """What the request log and the metrics will say of this request (observe.request_log)."""
    return request.state.record


class RequestPipeline:
    def __init__(self, config: AppConfig, access: Access, catalog: Catalog, engines: ReplicaClient,
                 full_vocab: FullVocabResponses):
        self.config, self.access, self.catalog = config, access, catalog
        self.engines, self.full_vocab = engines, full_vocab
        self.vocabularies = {m.name: Vocabulary.load(m.resolved_path()) for m in config.models}

    async def respond(self, request: Request, endpoint: Endpoint) -> Response:
        """An online request to a generating endpoint, answered as it asks: streamed events,
        the full vocabulary's streamed body, or one JSON body."""
        parsed = await self.parse(request, endpoint.request, self.rules(endpoint))
        full_vocab = parsed.body.prompt_logprobs == -1
        check_form(request, full_vocab=full_vocab)
        admitted = await self.admit(parsed, endpoint)
        if parsed.body.stream:
            return await self.stream(parsed, admitted, endpoint.stream)
        if full_vocab:
            return await self.full_vocab_response(request, parsed, admitted)
        return json_response(await self.answer(parsed, admitted, endpoint))

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

    def rules(self, endpoint: Endpoint) -> FieldRules:
        return partial(admission.rules, ingress=self.config.ingress, chat=endpoint.chat)

    async def parse_plain(self, request: Request, kind: type[StrictRequest],
                          rules: dict[str, str]) -> tuple[Tenant, StrictRequest]:
        """The caller's tenant, then its body, for an endpoint of no model's field rules."""
        tenant = await self.tenant(request)
        raw = await json_object(request, self.config.ingress.max_body_bytes)
        return tenant, parse_request(kind, raw, rules)

    async def parse(self, request: Request, kind: type[StrictRequest], rules: FieldRules,
                    model_optional: bool = False) -> ParsedRequest:
        """The caller's tenant, then its body; with `model_optional`, a body that names no
        model is for the tenant's only one."""
        tenant, record = await self.tenant(request), record_of(request)
        raw = await json_object(request, self.config.ingress.max_body_bytes)
        if model_optional and "model" not in raw:
            raw = {**raw, "model": self.only_model(tenant)}
        return await self.parsed(tenant, record, raw, kind, rules)

    async def parsed(self, tenant: Tenant, record: RequestRecord, raw: dict, kind: type[StrictRequest],
                     rules: FieldRules) -> ParsedRequest:
        """The body parsed strictly for its tenant, with the field rules of its model as this
        tenant has it (the model is recorded even if the rest is refused). A loaded adapter is
        leased until the response is over (serve_app.front.catalog)."""
        named = (await self.catalog.find(raw["model"], record.tenant, tenant)
                 if isinstance(raw.get("model"), str) else None)
        if named:
            record.model = named.name
        caps = tenant.capabilities(named.model.capabilities) if named else None
        body = parse_request(kind, raw, rules(caps))
        if named is None:
            raise await self.catalog.not_found(body.model, record.tenant, tenant)
        record.on_finish.append(await self.catalog.lease(named))
        return ParsedRequest(tenant, body, named, self.vocabularies[named.model.name],
                             tenant.capabilities(named.model.capabilities), record)

    async def admit(self, parsed: ParsedRequest, endpoint: Endpoint) -> Admitted:
        """Every check, then the request's prompt tokens recorded and charged to its tenant's rate."""
        admitted = endpoint.admit(parsed.body, parsed.caps, self.config.ingress, parsed.vocab, parsed.caller)
        record = parsed.record
        record.prompt_tokens, record.scored_tokens = admitted.prompt_tokens, admitted.scored_tokens
        await self.access.charge_prompt(parsed.tenant, parsed.record, admitted.full_vocab_positions)
        return admitted

    async def answer(self, parsed: ParsedRequest, admitted: Admitted, endpoint: Endpoint) -> dict:
        """The engine's results, shaped as the endpoint's JSON body."""
        results = await self.engines.generate(parsed.model.name, admitted.engine_requests)
        record_results(parsed.record, results, parsed.body.n)
        return endpoint.answer(parsed.served.name, admitted, results, parsed.body, parsed.vocab)

    async def stream(self, parsed: ParsedRequest, admitted: Admitted,
                     kind: type[ChoiceStream]) -> StreamingResponse:
        stream = kind(parsed.served.name, parsed.body, admitted.prompts, parsed.vocab)
        return await event_stream(self.engines.events(parsed.model.name, admitted.engine_requests,
                                                      parsed.record, stream))

    async def full_vocab_response(self, request: Request, parsed: ParsedRequest,
                                  admitted: Admitted) -> StreamingResponse:
        """prompt_logprobs -1: the whole distributions, streamed; a bounded number at once, in
        all and per tenant."""
        release = await self.full_vocab_places(parsed)
        try:
            prompts = [StreamedRows(self.engines.full_vocab_windows(parsed.model.name, r))
                       for r in admitted.engine_requests]
            await prompts[0].first()
            return self.full_vocab.body(request, parsed.model.name, parsed.served.name, parsed.vocab,
                                        parsed.body, admitted, prompts, release, parsed.record)
        except BaseException:
            release()
            raise

    async def full_vocab_places(self, parsed: ParsedRequest) -> Callable[[], None]:
        """A place among the tenant's full-vocabulary requests, then one of this replica's
        slots; returns the release of both."""
        with ExitStack() as undo:
            tenant_place = await self.access.full_vocab_place(parsed.tenant, parsed.record)
            undo.callback(tenant_place)
            slot = await self.full_vocab.slot()
            undo.pop_all()
        return once(lambda: (slot(), tenant_place()))
