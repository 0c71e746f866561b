"""/v1/chat/completions responses: engine results shaped into OpenAI's chat.completion object.

Pure functions over plain data. A token's `bytes` are the UTF-8 of its piece of the content
(probserve.text.pieces), so that they join into the content's bytes; a special token, never part
of the content, has `bytes: null`.
"""

import uuid

from probserve.api.admission import PromptInput
from probserve.api.completions import (
    choice_completions,
    completion_usage,
    finite,
    reported_width,
    response_head,
)
from probserve.api.request_models import ChatRequest
from probserve.engine.wire import Completion, EngineResult, PositionLogprobs
from probserve.text.pieces import GeneratedPieces, Pieces
from probserve.text.vocabulary import Vocabulary


def token_bytes(token_id: int, text: str, vocab: Vocabulary) -> list[int] | None:
    return None if token_id in vocab.special_ids else list(text.encode())


def candidates(entries: PositionLogprobs, position: int, width: int, vocab: Vocabulary) -> list[dict]:
    """The top k (or the labels, in the order asked): OpenAI's chat lists exactly these."""
    ids, logprobs, _ = entries.top(position, width)
    return [{"token": vocab.token(t), "logprob": finite(lp), "bytes": token_bytes(t, vocab.token(t), vocab)}
            for t, lp in zip(ids.tolist(), logprobs.tolist())]


def content_logprobs(completion: Completion, pieces: Pieces, width: int, vocab: Vocabulary) -> list[dict]:
    """`logprobs.content`: one entry per generated token."""
    entries = completion.logprobs
    return [{"token": token, "logprob": finite(entries.actual(position)[1]),
             "bytes": token_bytes(token_id, token, vocab),
             "top_logprobs": candidates(entries, position, width, vocab)}
            for position, (token_id, token) in enumerate(zip(completion.token_ids.tolist(), pieces.tokens))]


def choice_logprobs(completion: Completion, pieces: Pieces, request: ChatRequest,
                    vocab: Vocabulary) -> dict | None:
    width = reported_width(request)
    if width is None:
        return None
    return {"content": content_logprobs(completion, pieces, width, vocab)}


def generated_pieces(prompt: PromptInput, completion: Completion, vocab: Vocabulary) -> Pieces:
    return GeneratedPieces(vocab, prompt.token_ids).add(completion.token_ids.tolist(),
                                                         len(completion.text))


def chat_response(model: str, prompt: PromptInput, result: EngineResult, request: ChatRequest,
                  vocab: Vocabulary) -> dict:
    completions = choice_completions(result, request.n)
    choices = [
        {"index": index,
         "message": {"role": "assistant", "content": completion.text},
         "logprobs": choice_logprobs(completion, generated_pieces(prompt, completion, vocab),
                                     request, vocab),
         "finish_reason": completion.finish_reason}
        for index, completion in enumerate(completions)
    ]
    return {**response_head(f"chatcmpl-{uuid.uuid4().hex}", "chat.completion", model), "choices": choices,
            "usage": completion_usage([prompt], [result], request.n)}
