"""Server-sent events for /v1/completions with `stream: true`: engine deltas to OpenAI chunks.

Each prompt's replica stream yields EngineResults holding only what is new; this turns them
into `data: {...}` events, one choice per event, then an optional usage event and `[DONE]`.
"""

import time
import uuid

import orjson

from serve_app.admission import PromptInput, is_greedy
from serve_app.completions import LogprobsBuilder, add_generated
from serve_app.protocol import CompletionRequest
from serve_app.scoring import Completion, EngineResult
from serve_app.vocabulary import Vocabulary

DONE = b"data: [DONE]\n\n"


def event(payload: dict) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


class CompletionStream:
    def __init__(self, model: str, request: CompletionRequest, prompts: list[PromptInput],
                 vocab: Vocabulary):
        self.request, self.prompts, self.vocab = request, prompts, vocab
        self.header = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                       "created": int(time.time()), "model": model}
        self.offsets: dict[int, int] = {}  # choice index -> code points of its text so far
        self.completion_tokens = 0

    def choice_indices(self, prompt_index: int, completion: Completion) -> list[int]:
        """Choices a completion feeds: its own, or all n when a greedy one stands for them."""
        n = self.request.n
        first = prompt_index * n
        return list(range(first, first + n)) if is_greedy(self.request) else [first + completion.index]

    def events(self, prompt_index: int, delta: EngineResult) -> list[bytes]:
        return [self.choice_event(index, completion)
                for completion in delta.completions
                if len(completion.token_ids) or completion.finish_reason
                for index in self.choice_indices(prompt_index, completion)]

    def choice_event(self, index: int, completion: Completion) -> bytes:
        self.completion_tokens += len(completion.token_ids)
        logprobs = None
        if self.request.logprobs is not None:
            builder = LogprobsBuilder(self.vocab, self.request.logprobs)
            self.offsets[index] = add_generated(builder, completion, self.offsets.get(index, 0))
            logprobs = builder.build()
        choice = {"index": index, "text": completion.text, "logprobs": logprobs,
                  "finish_reason": completion.finish_reason}
        return event({**self.header, "choices": [choice]})

    def closing_events(self) -> list[bytes]:
        options = self.request.stream_options
        if options is None or not options.include_usage:
            return [DONE]
        prompt_tokens = sum(len(p.token_ids) for p in self.prompts)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": self.completion_tokens,
                 "total_tokens": prompt_tokens + self.completion_tokens}
        return [event({**self.header, "choices": [], "usage": usage}), DONE]
