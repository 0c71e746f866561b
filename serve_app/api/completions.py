"""/v1/completions responses: engine results shaped into OpenAI's text_completion object.

Pure functions over plain data; the ingress deployment wires them to HTTP and the replicas.
"""

import time
import uuid

from serve_app.api.admission import span_start
from serve_app.api.prompts import PromptInput
from serve_app.api.request_models import CompletionRequest, SamplingRequest
from serve_app.engine.wire import Completion, EngineResult, PositionLogprobs
from serve_app.text.pieces import GeneratedPieces, Pieces, string_pieces
from serve_app.text.vocabulary import Vocabulary
from serve_app.vllm_constants import NEG_INF_LOGPROB


def finite(logprob: float) -> float:
    return max(float(logprob), NEG_INF_LOGPROB)


def top_logprobs_at(entries: PositionLogprobs, position: int, width: int, vocab: Vocabulary) -> dict:
    """{token text: logprob} of the top k (or the labels), plus the actual token when it is
    not among them."""
    token_id, logprob, _ = entries.actual(position)
    ids, logprobs, _ = entries.top(position, width)
    top = {vocab.token(t): finite(lp) for t, lp in zip(ids.tolist(), logprobs.tolist())}
    if token_id not in ids:
        top[vocab.token(token_id)] = finite(logprob)
    return top


def reported_width(request: SamplingRequest) -> int | None:
    """Entries each reported position lists besides its own token: the labels, or the top-k."""
    labels = request.logprob_token_ids
    return len(labels) if labels else request.top_k()


class LogprobsBuilder:
    """Accumulates the OpenAI completions `logprobs` object, position by position."""

    def __init__(self, vocab: Vocabulary, width: int | None):
        self.vocab, self.width = vocab, width
        self.text_offset, self.tokens, self.token_ids = [], [], []
        self.token_logprobs, self.top_logprobs = [], []

    def add(self, entries: PositionLogprobs, position: int, token_id: int, token: str,
            offset: int) -> None:
        scored = entries.is_scored(position)
        self.text_offset.append(offset)
        self.tokens.append(token)
        self.token_ids.append(token_id)
        self.token_logprobs.append(finite(entries.actual(position)[1]) if scored else None)
        if self.width is not None:
            self.top_logprobs.append(
                top_logprobs_at(entries, position, self.width, self.vocab) if scored else None)

    def add_all(self, entries: PositionLogprobs, positions: range, token_ids: list[int],
                pieces: Pieces) -> None:
        for position, token_id, token, offset in zip(positions, token_ids, pieces.tokens,
                                                     pieces.offsets):
            self.add(entries, position, token_id, token, offset)

    def build(self) -> dict:
        return {
            "text_offset": self.text_offset,
            "tokens": self.tokens,
            "token_ids": self.token_ids,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs if self.width is not None else None,
        }


def prompt_pieces(prompt: PromptInput, vocab: Vocabulary) -> Pieces:
    if prompt.pieces is not None:
        return prompt.pieces
    return string_pieces(prompt.text, prompt.spans, prompt.token_ids, vocab)


def choice_logprobs(prompt: PromptInput, pieces: Pieces | None, result: EngineResult,
                    completion: Completion, request: CompletionRequest,
                    vocab: Vocabulary) -> dict | None:
    """`pieces`: the prompt's, when a span of it is reported."""
    start = span_start(request)
    builder = LogprobsBuilder(vocab, reported_width(request))
    base = 0
    if start is not None:
        ids = prompt.token_ids
        entries = result.prompt_positions(request.top_k() or 0)
        positions = range(start, len(ids))
        builder.add_all(entries, positions, ids[start:],
                        Pieces(pieces.tokens[start:], pieces.offsets[start:]))
        base = len(prompt.text)
    if request.top_k() is not None:
        add_generated(builder, completion, GeneratedPieces(vocab, prompt.token_ids, base),
                      base + len(completion.text))
    return builder.build() if builder.tokens or request.top_k() is not None else None


def add_generated(builder: LogprobsBuilder, completion: Completion, pieces: GeneratedPieces,
                  text_end: int | None) -> None:
    """Adds the generated tokens; `text_end` when the completion's text is whole."""
    ids = completion.token_ids.tolist()
    builder.add_all(completion.logprobs, range(len(ids)), ids, pieces.add(ids, text_end))


def prompt_logprobs_list(entries: PositionLogprobs, k: int, vocab: Vocabulary, start: int = 0) -> list:
    """vLLM's shape: position 0 (and those before `start`) null, then {token id: {logprob,
    rank, decoded_token}}."""
    return [prompt_logprobs_at(entries, p, k, vocab) if p >= start and entries.is_scored(p) else None
            for p in range(len(entries))]


def prompt_logprobs_at(entries: PositionLogprobs, position: int, k: int, vocab: Vocabulary) -> dict:
    """As vLLM builds it (vllm/logprobs.py, append_logprobs_for_next_position), and clients
    written against vLLM read it: the prompt token first with its true rank, then the top k
    by rank; a prompt token among them keeps the first place and takes the top-k's entry."""
    ids, logprobs, ranks = entries.top(position, k)
    token_id, logprob, rank = entries.actual(position)
    return {str(t): {"logprob": finite(lp), "rank": r, "decoded_token": vocab.token(t)}
            for t, lp, r in zip([token_id, *ids.tolist()], [logprob, *logprobs.tolist()],
                                [rank, *ranks.tolist()], strict=True)}


def choice(index: int, prompt: PromptInput, pieces: Pieces | None, result: EngineResult,
           completion: Completion, request: CompletionRequest, vocab: Vocabulary) -> dict:
    """A choice; with the full vocabulary, its `prompt_logprobs` are left to the body that
    streams them (serve_app.fullvocab.response)."""
    body = {
        "index": index,
        "text": (prompt.text if request.echo else "") + completion.text,
        "logprobs": choice_logprobs(prompt, pieces, result, completion, request, vocab),
        "finish_reason": completion.finish_reason,
    }
    if request.prompt_logprobs not in (None, -1):
        body["prompt_logprobs"] = prompt_logprobs_list(result.prompt_logprobs,
                                                       request.prompt_logprobs, vocab)
    return body


def choice_completions(result: EngineResult, n: int) -> list[Completion]:
    """The n completions of one prompt; a greedy one was generated once for all n."""
    return [result.completions[j % len(result.completions)] for j in range(n)]


def prompt_choices(prompt_index: int, prompt: PromptInput, result: EngineResult,
                   request: CompletionRequest, vocab: Vocabulary) -> list[dict]:
    """The n choices of one prompt."""
    # Once per prompt, however many choices it has.
    pieces = prompt_pieces(prompt, vocab) if span_start(request) is not None else None
    return [choice(prompt_index * request.n + j, prompt, pieces, result, completion, request, vocab)
            for j, completion in enumerate(choice_completions(result, request.n))]


def completion_response(model: str, prompts: list[PromptInput], results: list[EngineResult],
                        request: CompletionRequest, vocab: Vocabulary) -> dict:
    choices = [choice for i, (prompt, result) in enumerate(zip(prompts, results))
               for choice in prompt_choices(i, prompt, result, request, vocab)]
    return {**response_head(f"cmpl-{uuid.uuid4().hex}", "text_completion", model), "choices": choices,
            "usage": completion_usage(prompts, results, request.n)}


def response_head(response_id: str, object_name: str, model: str) -> dict:
    """The members before `choices`."""
    return {"id": response_id, "object": object_name, "created": int(time.time()), "model": model}


def completion_tokens(results: list[EngineResult], n: int) -> int:
    """Generated tokens as a response counts them: every choice's."""
    return sum(len(c.token_ids) for result in results for c in choice_completions(result, n))


def completion_usage(prompts: list[PromptInput], results: list[EngineResult], n: int) -> dict:
    """Each prompt once, every generated token of every choice."""
    return usage_counts(sum(len(p.token_ids) for p in prompts), completion_tokens(results, n))


def usage_counts(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
