"""`prompt_logprobs: -1` on the ingress: a bounded number of whole-distribution responses at
once (in all, and per tenant), each streamed as the serializer pool writes its chunks, as JSON
(gzip when accepted) or as `.npy`."""

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from fastapi import Request
from fastapi.responses import StreamingResponse
from ray.serve.handle import DeploymentHandle

from serve_app.api import chat, completions
from serve_app.api.admission import Admitted
from serve_app.api.request_models import ChatRequest, CompletionRequest
from serve_app.config import AppConfig
from serve_app.engine.wire import EngineResult
from serve_app.errors import APIError, overloaded
from serve_app.front.http import streaming_body
from serve_app.fullvocab import npy
from serve_app.fullvocab.compression import accepts_gzip
from serve_app.fullvocab.json_rows import piece_positions
from serve_app.fullvocab.relay import full_vocab_body
from serve_app.fullvocab.response import chat_json_parts, json_parts
from serve_app.fullvocab.streamed import StreamedRows
from serve_app.gate import Gate
from serve_app.observe.metrics import HeldGauge
from serve_app.observe.request_log import RequestRecord
from serve_app.text.vocabulary import Vocabulary


def check_form(request: Request, full_vocab: bool) -> None:
    """The binary form exists for the full vocabulary only."""
    if npy.accepts_npy(request.headers.get("accept")) and not full_vocab:
        raise APIError(406, "not_acceptable", f"{npy.MEDIA_TYPE} is the form of "
                       "`prompt_logprobs: -1` only; accept application/json")


class FullVocabResponses:
    def __init__(self, config: AppConfig, serializers: DeploymentHandle):
        self.limits = config.ingress
        self.window = config.serializer_pool.window
        self.piece_bytes = config.serializer_pool.json_piece_bytes
        self.chunk_positions = config.serializer_pool.chunk_positions
        self.serializers = serializers
        waiting = HeldGauge("probserve_full_vocab_waiting")
        waiting.set(0)  # exported from the start, not from the first request that waits
        self.slots = Gate(self.limits.max_full_vocab_requests, waiting.change)

    async def slot(self) -> Callable[[], None]:
        """One of this replica's slots, within the configured wait and number of waiters, else
        503 `overloaded`; returns its release."""
        return await self.slots.enter(self.limits.max_full_vocab_waiting, self.limits.full_vocab_wait_s,
                                      self.busy)

    def busy(self, gate: Gate) -> APIError:
        return overloaded(f"all {gate.bound} full-vocabulary slots of this replica are busy and "
                          f"{gate.waiting} requests wait for one (at most "
                          f"{self.limits.max_full_vocab_waiting}, each for at most "
                          f"{self.limits.full_vocab_wait_s:g} s): retry later", self.limits.retry_after_s)

    def body(self, request: Request, model: str, served: str, vocab: Vocabulary,
             body: CompletionRequest | ChatRequest, admitted: Admitted, prompts: list[StreamedRows],
             release: Callable[[], None], record: RequestRecord) -> StreamingResponse:
        """The response streamed as its prompts' windows come: `.npy` when asked by name,
        else JSON; `release` when it ends. `model` is the vocabulary's (the pool's key),
        `served` what the answer names (an adapter's name)."""
        if npy.accepts_npy(request.headers.get("accept")):  # never gzip: float32 noise
            parts = npy.body_parts([p.token_ids for p in admitted.prompts], prompts, vocab.logits_size)
            chunks = full_vocab_body(parts, lambda chunk: self.serializers.write_npy.remote(model, chunk),
                                     self.window, gzip=False)
            return streaming_body(recorded(chunks, prompts, body.n, record), npy.MEDIA_TYPE, False,
                                  release, record)
        gzip = accepts_gzip(request.headers.get("accept-encoding"))
        piece = self.chunk_positions if gzip else piece_positions(vocab.logits_size, self.piece_bytes)
        parts = response_parts(served, vocab, body, admitted, prompts, piece)
        chunks = full_vocab_body(parts, lambda piece: self.serializers.write.remote(model, piece, gzip),
                                 self.window, gzip)
        return streaming_body(recorded(chunks, prompts, body.n, record), "application/json", gzip,
                              release, record)


def response_parts(model: str, vocab: Vocabulary, body: CompletionRequest | ChatRequest,
                   admitted: Admitted, prompts: list[StreamedRows],
                   piece: int) -> AsyncIterator[bytes | AsyncIterator]:
    """The JSON body's parts in the endpoint's shape."""
    if isinstance(body, ChatRequest):
        return chat_json_parts(chat.chat_head(model), prompts[0],
                               lambda result: chat.response_members(admitted, result, body, vocab), piece)
    head = completions.response_head(f"cmpl-{uuid.uuid4().hex}", "text_completion", model)

    def choices(index: int, result: EngineResult) -> list[dict]:
        return completions.prompt_choices(index, admitted.prompts[index], result, body, vocab)

    return json_parts(head, prompts, body.n, choices,
                      lambda results: completions.completion_usage(admitted.prompts, results, body.n), piece)


async def recorded(chunks: AsyncIterator[bytes], prompts: list[StreamedRows], n: int,
                   record: RequestRecord) -> AsyncIterator[bytes]:
    """The body's chunks, then what its prompts generated and waited in the record; their
    computation is stopped if the body stops early."""
    try:
        async with aclosing(chunks):
            async for chunk in chunks:
                yield chunk
        record_results(record, [rows.result() for rows in prompts], n)
    finally:
        for rows in prompts:
            await rows.close()


def record_results(record: RequestRecord, results: list[EngineResult], n: int) -> None:
    record.generated_tokens = completions.completion_tokens(results, n)
    record.queue_time_s = max((r.queue_time_s for r in results if r.queue_time_s is not None), default=None)
