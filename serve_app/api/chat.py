"""/v1/chat/completions responses: engine results shaped into OpenAI's chat.completion object,
with vLLM's additions (`prompt_logprobs` at the top level, `echo`) and the final message's
scores (`final_message_logprobs`).

Pure functions over plain data. A token's `bytes` are the UTF-8 of its piece of the content
(serve_app.text.pieces), so that they join into the content's bytes; a special token, never part
of the content, has `bytes: null`.
"""

import math
import uuid

from serve_app.api.admission import Admitted
from serve_app.api.completions import (
    choice_completions,
    completion_usage,
    finite,
    prompt_logprobs_list,
    reported_width,
    response_head,
)
from serve_app.api.conversation import MessageTokens
from serve_app.api.prompts import PromptInput
from serve_app.api.request_models import ChatRequest
from serve_app.engine.wire import Completion, EngineResult, PositionLogprobs
from serve_app.text.pieces import GeneratedPieces, Pieces
from serve_app.text.vocabulary import Vocabulary


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


def echoed(request: ChatRequest) -> str:
    """What echo puts before each choice's content: the final message's text when the answer
    continues its role, as vLLM does."""
    last = request.messages[-1]
    return last.text() if request.echo and last.role == request.response_role() else ""


def scored_token(entries: PositionLogprobs, position: int, piece: str, offset: int, width: int,
                 vocab: Vocabulary) -> dict:
    token_id, logprob, rank = entries.actual(position)
    return {"token": piece, "token_id": token_id, "text_offset": offset, "logprob": finite(logprob),
            "rank": rank, "bytes": list(piece.encode()),
            "top_logprobs": candidates(entries, position, width, vocab)}


def final_message_logprobs(final: MessageTokens, result: EngineResult, request: ChatRequest,
                           vocab: Vocabulary) -> dict:
    """Each of the final message's tokens with its piece of the message's text and the offset
    of that piece in it, its logprob and rank, and the top k (or the labels); and their sum."""
    width = request.scored_width()
    entries = result.prompt_positions(width) if final else None
    content = [scored_token(entries, position, piece, offset, width, vocab)
               for position, piece, offset in zip(final.positions, final.pieces.tokens,
                                                  final.pieces.offsets, strict=True)]
    return {"role": request.messages[-1].role, "content": content,
            "logprob_sum": math.fsum(token["logprob"] for token in content)}


def response_members(admitted: Admitted, result: EngineResult, request: ChatRequest,
                     vocab: Vocabulary) -> dict:
    """Everything after the head; `prompt_logprobs` but for the full vocabulary, which its
    body streams (serve_app.fullvocab.response)."""
    prompt = admitted.prompts[0]
    role, echo = request.response_role(), echoed(request)
    choices = [
        {"index": index,
         "message": {"role": role, "content": echo + completion.text},
         "logprobs": choice_logprobs(completion, generated_pieces(prompt, completion, vocab),
                                     request, vocab),
         "finish_reason": completion.finish_reason}
        for index, completion in enumerate(choice_completions(result, request.n))
    ]
    members = {"choices": choices, "usage": completion_usage([prompt], [result], request.n)}
    width = request.prompt_width()
    if width is not None and request.prompt_logprobs != -1:
        members["prompt_logprobs"] = prompt_logprobs_list(result.prompt_positions(width), width, vocab,
                                                          request.logprob_start_len or 0)
    if admitted.final_message is not None:
        members["final_message_logprobs"] = final_message_logprobs(admitted.final_message, result,
                                                                   request, vocab)
    return members


def chat_head(model: str) -> dict:
    return response_head(f"chatcmpl-{uuid.uuid4().hex}", "chat.completion", model)


def chat_response(model: str, admitted: Admitted, result: EngineResult, request: ChatRequest,
                  vocab: Vocabulary) -> dict:
    return {**chat_head(model), **response_members(admitted, result, request, vocab)}
