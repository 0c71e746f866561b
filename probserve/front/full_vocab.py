"""`prompt_logprobs: -1` on the ingress: a bounded number of whole-distribution responses at
once (in all, and per tenant), each streamed as the serializer pool writes its chunks, as JSON
(gzip when accepted) or as `.npy`."""

from collections.abc import Callable

from fastapi import Request
from fastapi.responses import StreamingResponse
from ray.serve.handle import DeploymentHandle

from probserve.api import completions
from probserve.api.admission import Admitted
from probserve.api.request_models import CompletionRequest
from probserve.config import AppConfig
from probserve.engine.wire import EngineResult
from probserve.errors import APIError, overloaded
from probserve.front.http import streaming_body
from probserve.fullvocab import npy
from probserve.fullvocab.compression import accepts_gzip
from probserve.fullvocab.relay import full_vocab_body
from probserve.fullvocab.response import choice_arrays, json_parts
from probserve.gate import Gate
from probserve.observe.metrics import HeldGauge
from probserve.observe.request_log import RequestRecord
from probserve.text.vocabulary import Vocabulary


def check_form(request: Request, full_vocab: bool) -> None:
    """The binary form exists for the full vocabulary only."""
    if npy.accepts_npy(request.headers.get("accept")) and not full_vocab:
        raise APIError(406, "not_acceptable", f"{npy.MEDIA_TYPE} is the form of "
                       "`prompt_logprobs: -1` on /v1/completions only; accept application/json")


class FullVocabResponses:
    def __init__(self, config: AppConfig, serializers: DeploymentHandle):
        self.limits = config.ingress
        self.window = config.serializer_pool.window
        self.serializers = serializers
        waiting = HeldGauge("probserve_full_vocab_waiting")
        self.slots = Gate(self.limits.max_full_vocab_requests, waiting.change)

    async def slot(self) -> Callable[[], None]:
        """One of this replica's slots, within the configured wait and number of waiters, else
        503 `overloaded`; returns its release."""
        return await self.slots.enter(self.limits.max_full_vocab_waiting, self.limits.full_vocab_wait_s,
                                      self.busy)

    def busy(self, gate: Gate) -> APIError:
        return overloaded(f"all {gate.bound} full-vocabulary slots of this replica are busy and "
                          f"{self.limits.max_full_vocab_waiting} requests wait for one: retry later",
                          self.limits.retry_after_s)

    def body(self, request: Request, model: str, vocab: Vocabulary, body: CompletionRequest,
             admitted: Admitted, results: list[EngineResult], release: Callable[[], None],
             record: RequestRecord) -> StreamingResponse:
        """The response streamed: `.npy` when asked by name, else JSON; `release` when it ends."""
        if npy.accepts_npy(request.headers.get("accept")):  # never gzip: float32 noise
            parts = npy.body_parts([p.token_ids for p in admitted.prompts], results, vocab.logits_size)
            chunks = full_vocab_body(parts, lambda chunk: self.serializers.write_npy.remote(model, chunk),
                                     self.window, gzip=False)
            return streaming_body(chunks, npy.MEDIA_TYPE, False, release, record)
        gzip = accepts_gzip(request.headers.get("accept-encoding"))
        response = completions.completion_response(model, admitted.prompts, results, body, vocab)
        parts = json_parts(response, choice_arrays(results, body.n))
        chunks = full_vocab_body(parts, lambda chunk: self.serializers.write.remote(model, [chunk], gzip),
                                 self.window, gzip)
        return streaming_body(chunks, "application/json", gzip, release, record)
