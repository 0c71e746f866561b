"""Server-sent events for `stream: true`: engine deltas to OpenAI chunks, on /v1/completions
(`text_completion` chunks) and /v1/chat/completions (`chat.completion.chunk`).

Each prompt's replica stream yields EngineResults holding only what is new; a stream turns
them into `data: {...}` events, one choice per event, then an optional usage event and
`[DONE]`. Token pieces and offsets continue from one event to the next as in the whole answer.
"""

import time
import uuid
from abc import ABC, abstractmethod

import orjson

from serve_app.api import chat
from serve_app.api.admission import is_greedy
from serve_app.api.completions import LogprobsBuilder, add_generated, reported_width, usage_counts
from serve_app.api.prompts import PromptInput
from serve_app.api.request_models import ChatRequest, CompletionRequest, SamplingRequest
from serve_app.engine.wire import Completion, EngineResult
from serve_app.text.pieces import GeneratedPieces
from serve_app.text.vocabulary import Vocabulary

DONE = b"data: [DONE]\n\n"


def event(payload: dict) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


class ChoiceStream(ABC):
    """What both endpoints' streams share: choices fed by deltas, pieces, usage, the end."""

    object_name = ""
    id_prefix = ""

    def __init__(self, model: str, request: SamplingRequest, prompts: list[PromptInput],
                 vocab: Vocabulary):
        self.request, self.prompts, self.vocab = request, prompts, vocab
        self.header = {"id": f"{self.id_prefix}{uuid.uuid4().hex}", "object": self.object_name,
                       "created": int(time.time()), "model": model}
        self.pieces: dict[int, GeneratedPieces] = {}  # choice index -> its pieces so far
        self.text_lengths: dict[int, int] = {}  # choice index -> code points sent
        self.completion_tokens = 0

    def choice_indices(self, prompt_index: int, completion: Completion) -> list[int]:
        """Choices a completion feeds: its own, or all n when a greedy one stands for them."""
        n = self.request.n
        first = prompt_index * n
        return list(range(first, first + n)) if is_greedy(self.request) else [first + completion.index]

    def events(self, prompt_index: int, delta: EngineResult) -> list[bytes]:
        return [self.choice_event(index, prompt_index, completion)
                for completion in delta.completions
                if len(completion.token_ids) or completion.finish_reason
                for index in self.choice_indices(prompt_index, completion)]

    def choice_event(self, index: int, prompt_index: int, completion: Completion) -> bytes:
        self.completion_tokens += len(completion.token_ids)
        first = index not in self.pieces
        if first:
            self.pieces[index] = GeneratedPieces(self.vocab, self.prompts[prompt_index].token_ids)
            self.text_lengths[index] = 0
        self.text_lengths[index] += len(completion.text)
        # The text is whole once the choice finishes: a stop string may have cut it.
        text_end = self.text_lengths[index] if completion.finish_reason else None
        return event({**self.header, "choices": [self.choice(index, completion, text_end, first)]})

    @abstractmethod
    def choice(self, index: int, completion: Completion, text_end: int | None, first: bool) -> dict:
        """One choice of a chunk, in the endpoint's shape."""

    def closing_events(self) -> list[bytes]:
        options = self.request.stream_options
        if options is None or not options.include_usage:
            return [DONE]
        prompt_tokens = sum(len(p.token_ids) for p in self.prompts)
        usage = usage_counts(prompt_tokens, self.completion_tokens)
        return [event({**self.header, "choices": [], "usage": usage}), DONE]


class CompletionStream(ChoiceStream):
    object_name = "text_completion"
    id_prefix = "cmpl-"
    request: CompletionRequest

    def choice(self, index: int, completion: Completion, text_end: int | None, first: bool) -> dict:
        logprobs = None
        if self.request.top_k() is not None:
            builder = LogprobsBuilder(self.vocab, reported_width(self.request))
            add_generated(builder, completion, self.pieces[index], text_end)
            logprobs = builder.build()
        return {"index": index, "text": completion.text, "logprobs": logprobs,
                "finish_reason": completion.finish_reason}


class ChatStream(ChoiceStream):
    object_name = "chat.completion.chunk"
    id_prefix = "chatcmpl-"
    request: ChatRequest

    def choice(self, index: int, completion: Completion, text_end: int | None, first: bool) -> dict:
        pieces = self.pieces[index].add(completion.token_ids.tolist(), text_end)
        delta = {"content": completion.text}
        if first:
            delta = {"role": self.request.response_role(), **delta}
        return {"index": index, "delta": delta,
                "logprobs": chat.choice_logprobs(completion, pieces, self.request, self.vocab),
                "finish_reason": completion.finish_reason}
