"""Ingress: the HTTP front door, which routes. Each generating endpoint runs the request
pipeline (serve_app.front.pipeline: parse -> admit -> charge -> send -> shape); Files and
Batches are the batch front's (serve_app.front.batch_api); the viewer's files its own
(serve_app.front.viewer).
"""

import asyncio
import time

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from ray import serve
from ray.serve.handle import DeploymentHandle

from serve_app.api import tokenize
from serve_app.api.model_list import model_card
from serve_app.api.openapi import install_openapi
from serve_app.api.request_models import (
    DETOKENIZE_RULES,
    LOAD_ADAPTER_RULES,
    TOKENIZE_RULES,
    UNLOAD_ADAPTER_RULES,
    DetokenizeRequest,
    LoadAdapterRequest,
    TokenizeRequest,
    UnloadAdapterRequest,
)
from serve_app.config import AppConfig, Served
from serve_app.errors import not_ready
from serve_app.front.batch_api import BatchAPI
from serve_app.front.catalog import Catalog
from serve_app.front.full_vocab import FullVocabResponses
from serve_app.front.http import install_error_handlers, json_response
from serve_app.front.pipeline import CHAT, COMPLETIONS, RequestPipeline, record_of
from serve_app.front.replica_client import ReplicaClient
from serve_app.front.viewer import ViewerFiles
from serve_app.observe.availability import ReplicaStates, running_replicas, serve_details
from serve_app.observe.metrics import RequestObserver
from serve_app.observe.request_log import ObservedRequests
from serve_app.tenants.access import Access
from serve_app.tenants.keyring import ANONYMOUS, UNLIMITED, Tenant
from serve_app.tenants.usage import usage_body

# No /docs or /redoc: their pages load scripts from a CDN, which clusters often cannot reach;
# /openapi.json is the contract, for any OpenAPI viewer.
app = FastAPI(title="probserve", summary="Log-probabilities of text, OpenAI-compatible",
              docs_url=None, redoc_url=None)
install_openapi(app)
install_error_handlers(app)
# Before the Ingress class: Ray Serve freezes the app when it decorates the class.
OBSERVER = RequestObserver()
app.add_middleware(ObservedRequests, observer=OBSERVER)


@serve.deployment
@serve.ingress(app)
class Ingress:
    def __init__(self, config: AppConfig, replicas: dict[str, DeploymentHandle],
                 serializers: DeploymentHandle, batch_runner: DeploymentHandle):
        self.config = config
        self.created = int(time.time())
        app_name = serve.get_replica_context().app_name
        states = ReplicaStates(lambda: running_replicas(serve_details(), app_name))
        self.engines = ReplicaClient(config, replicas, states)
        access = Access(config.tenancy, config.ingress.retry_after_s)
        self.catalog = Catalog(config, config.ingress.retry_after_s, access.spawn)
        self.pipeline = RequestPipeline(config, access, self.catalog, self.engines,
                                        FullVocabResponses(config, serializers))
        self.viewer = ViewerFiles(config.ingress.ui)
        self.batch = BatchAPI(config.batch, self.pipeline, OBSERVER, batch_runner)

    @app.get("/livez")
    async def live(self) -> Response:
        """Liveness: this ingress replica answers. It asks no model: a model that is down must
        not get the ingress restarted."""
        return json_response({"status": "ok"})

    @app.get("/health")
    async def health(self, model: str | None = None) -> Response:
        """Readiness of every model, or of one (`?model=`): 200 when ready, else 503
        `not_ready` naming the models that are not, with each model's state."""
        names = ([m.name for m in self.config.models] if model is None
                 else [(await self.catalog.served(model, ANONYMOUS, UNLIMITED)).model.name])
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
        """The token-probability viewer (serve_app.front.viewer)."""
        return self.viewer.response("index.html")

    @app.get("/ui/{name}", include_in_schema=False)
    async def viewer_file(self, name: str) -> Response:
        return self.viewer.response(name)

    @app.get("/v1/models")
    async def models(self, request: Request) -> Response:
        """The models and adapters the caller's tenant may use, with its caps."""
        tenant = await self.pipeline.tenant(request)
        listed = await self.catalog.listed(record_of(request).tenant, tenant)
        return json_response({"object": "list", "data": [self.card(s, tenant) for s in listed]})

    def card(self, served: Served, tenant: Tenant) -> dict:
        return model_card(served, tenant.capabilities(served.model.capabilities),
                          served.created or self.created, self.pipeline.vocabularies[served.model.name])

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(self, request: Request) -> Response:
        """vLLM's: a LoRA adapter of the caller's tenant, served as a model (serve_app.front.catalog)."""
        tenant, body = await self.pipeline.parse_plain(request, LoadAdapterRequest, LOAD_ADAPTER_RULES)
        served = await self.catalog.load(record_of(request).tenant, tenant, body)
        record_of(request).model = served.name
        return json_response(self.card(served, tenant))

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(self, request: Request) -> Response:
        tenant, body = await self.pipeline.parse_plain(request, UnloadAdapterRequest, UNLOAD_ADAPTER_RULES)
        record_of(request).model = body.lora_name
        await self.catalog.unload(record_of(request).tenant, tenant, body)
        return json_response({"id": body.lora_name, "object": "model", "deleted": True})

    @app.get("/v1/usage")
    async def usage(self, request: Request) -> Response:
        """The caller's tenant's usage (serve_app.tenants.usage)."""
        name = await self.pipeline.tenant_name(request)
        return json_response(usage_body(name, await self.pipeline.access.stored_usage(name)))

    @app.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        return await self.pipeline.respond(request, COMPLETIONS)

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        return await self.pipeline.respond(request, CHAT)

    async def batch_line(self, tenant_name: str, endpoint: str, body: dict) -> dict:
        """One line of a batch, for the batch runner (serve_app.batch.runner)."""
        return await self.batch.line(tenant_name, endpoint, body)

    def app_config(self) -> AppConfig:
        """The configuration this ingress runs (dataset scoring admits documents by it)."""
        return self.config

    async def served_to(self, tenant_name: str, name: str) -> Served:
        """What `name` is for a tenant (dataset scoring's run): a model or adapter, configured
        or loaded; 404 as for its requests."""
        return await self.catalog.served(name, tenant_name, UNLIMITED)

    @app.post("/v1/files")
    async def upload_file(self, request: Request) -> Response:
        return await self.batch.upload(request)

    @app.get("/v1/files")
    async def list_files(self, request: Request, purpose: str | None = None) -> Response:
        return await self.batch.files(request, purpose)

    @app.get("/v1/files/{file_id}")
    async def get_file(self, request: Request, file_id: str) -> Response:
        return await self.batch.file(request, file_id)

    @app.get("/v1/files/{file_id}/content")
    async def file_content(self, request: Request, file_id: str) -> Response:
        return await self.batch.content(request, file_id)

    @app.delete("/v1/files/{file_id}")
    async def delete_file(self, request: Request, file_id: str) -> Response:
        return await self.batch.delete(request, file_id)

    @app.post("/v1/batches")
    async def create_batch(self, request: Request) -> Response:
        return await self.batch.create(request)

    @app.get("/v1/batches")
    async def list_batches(self, request: Request, after: str | None = None, limit: int = 20) -> Response:
        return await self.batch.batches(request, after, limit)

    @app.get("/v1/batches/{batch_id}")
    async def get_batch(self, request: Request, batch_id: str) -> Response:
        return await self.batch.batch(request, batch_id)

    @app.post("/v1/batches/{batch_id}/cancel")
    async def cancel_batch(self, request: Request, batch_id: str) -> Response:
        return await self.batch.cancel(request, batch_id)

    @app.get("/tokenizer_info")
    async def tokenizer_info(self, request: Request, model: str | None = None) -> Response:
        """The tokenizer's configuration in vLLM's shape, of `?model=` or the caller's only
        model (serve_app.api.tokenize)."""
        tenant = await self.pipeline.tenant(request)
        name = model if model is not None else self.pipeline.only_model(tenant)
        chosen = (await self.catalog.served(name, record_of(request).tenant, tenant)).model
        record_of(request).model = chosen.name
        max_model_len = tenant.capabilities(chosen.capabilities).max_model_len
        return json_response(tokenize.tokenizer_info(self.pipeline.vocabularies[chosen.name], max_model_len))

    @app.post("/tokenize")
    async def tokenize(self, request: Request) -> Response:
        parsed = await self.pipeline.parse(request, TokenizeRequest, lambda _: TOKENIZE_RULES,
                                           model_optional=True)
        return json_response(tokenize.tokenize_response(parsed.body, parsed.vocab, parsed.caps.max_model_len))

    @app.post("/detokenize")
    async def detokenize(self, request: Request) -> Response:
        parsed = await self.pipeline.parse(request, DetokenizeRequest, lambda _: DETOKENIZE_RULES,
                                           model_optional=True)
        return json_response({"prompt": tokenize.detokenize(parsed.body, parsed.vocab)})
