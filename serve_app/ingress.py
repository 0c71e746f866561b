"""Ingress: the HTTP front door. Parses and checks every request, tokenizes, routes by `model`.

Nothing invalid reaches a model replica: every check runs here, before any replica call.
"""

import asyncio
import time

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.exceptions import HTTPException

from serve_app import completions
from serve_app.compression import accepts_gzip, gzip_chunks
from serve_app.config import AppConfig, ModelConfig
from serve_app.errors import APIError, error_envelope
from serve_app.full_vocab import EntryFragments
from serve_app.protocol import parse_completion_request
from serve_app.vocabulary import Vocabulary

app = FastAPI(title="probserve", summary="Log-probabilities of text, OpenAI-compatible")

HTTP_ERROR_CODES = {404: "not_found", 405: "method_not_allowed"}


def json_response(body: dict, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


@app.exception_handler(APIError)
async def api_error(_: Request, error: APIError) -> Response:
    return json_response(error.envelope(), error.status)


@app.exception_handler(HTTPException)
async def http_error(request: Request, error: HTTPException) -> Response:
    code = HTTP_ERROR_CODES.get(error.status_code, "http_error")
    message = f"{request.method} {request.url.path}: {error.detail}"
    return json_response(error_envelope(error.status_code, code, message), error.status_code)


@app.exception_handler(RequestValidationError)
async def validation_error(_: Request, error: RequestValidationError) -> Response:
    return json_response(error_envelope(400, "invalid_request", str(error)), 400)


async def json_object(request: Request) -> dict:
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as error:
        raise APIError(400, "invalid_json", f"the body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise APIError(400, "invalid_request", "the body must be a JSON object")
    return body


def streaming_json(chunks, accept_encoding: str | None) -> StreamingResponse:
    """A large body, sent as it is written; gzip when the client takes it."""
    if not accepts_gzip(accept_encoding):
        return StreamingResponse(chunks, media_type="application/json")
    return StreamingResponse(gzip_chunks(chunks), media_type="application/json",
                             headers={"Content-Encoding": "gzip", "Vary": "Accept-Encoding"})


def model_card(model: ModelConfig, created: int) -> dict:
    return {
        "id": model.name,
        "object": "model",
        "created": created,
        "owned_by": "probserve",
        "max_model_len": model.capabilities.max_model_len,
        "capabilities": model.capabilities.model_dump(),
    }


@serve.deployment
@serve.ingress(app)
class Ingress:
    def __init__(self, config: AppConfig, replicas: dict[str, DeploymentHandle]):
        self.config = config
        self.replicas = replicas
        self.vocabularies = {m.name: Vocabulary.load(m.resolved_path()) for m in config.models}
        self.fragments = {name: EntryFragments(v.strings) for name, v in self.vocabularies.items()}
        self.created = int(time.time())

    def model(self, name: str) -> ModelConfig:
        model = self.config.model(name)
        if model is None:
            known = ", ".join(m.name for m in self.config.models)
            raise APIError(404, "model_not_found", f"model {name!r} does not exist; "
                           f"this service has: {known}", "model")
        return model

    @app.get("/health")
    async def health(self) -> Response:
        try:
            await asyncio.gather(*(r.check_health.remote() for r in self.replicas.values()))
        except Exception as error:  # any replica failure means not ready
            raise APIError(503, "not_ready", f"a model is not ready: {error}") from None
        return json_response({"status": "ok"})

    @app.get("/v1/models")
    async def models(self) -> Response:
        cards = [model_card(m, self.created) for m in self.config.models]
        return json_response({"object": "list", "data": cards})

    @app.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        body = parse_completion_request(await json_object(request))
        model = self.model(body.model)
        caps, vocab = model.capabilities, self.vocabularies[model.name]
        completions.check_request(body, caps, self.config.ingress)
        prompts = completions.prompt_inputs(body.prompt, vocab, self.config.ingress.max_batch_prompts)
        completions.check_prompts(prompts, body, caps)
        replica = self.replicas[model.name]
        results = await asyncio.gather(*(
            replica.generate.remote(completions.engine_request(p, body)) for p in prompts))
        response = completions.completion_response(model.name, prompts, results, body, vocab)
        if body.prompt_logprobs != -1:
            return json_response(response)
        chunks = completions.streamed_body(response, results, self.fragments[model.name])
        return streaming_json(chunks, request.headers.get("accept-encoding"))
