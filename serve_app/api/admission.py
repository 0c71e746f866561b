"""Admission for /v1/completions and /v1/chat/completions: a parsed request and a model's
capabilities in, the checked, tokenized prompts and the engine requests out. Every refusal
happens here, before any replica. The two endpoints share every check on the fields they share.
"""

from dataclasses import dataclass

from serve_app.api.conversation import MessageTokens, final_message_tokens, render_chat
from serve_app.api.prompts import PromptInput
from serve_app.api.request_models import (
    ChatRequest,
    CompletionRequest,
    SamplingRequest,
    chat_rules,
    completion_rules,
    field_error,
)
from serve_app.config import Capabilities, IngressConfig
from serve_app.engine.wire import Caller, EngineRequest
from serve_app.errors import invalid
from serve_app.text.pieces import id_prompt_pieces
from serve_app.text.vocabulary import Vocabulary
from serve_app.vllm_constants import SAMPLING_EPS


@dataclass(frozen=True)
class Admitted:
    """A request that passed every check: its prompts, what to ask the engine for each, and
    what it will cost."""

    prompts: list["PromptInput"]
    engine_requests: list[EngineRequest]
    scored_tokens: int = 0  # prompt tokens whose logprobs it asks for
    full_vocab_positions: int = 0  # rows of the full vocabulary it asks for
    final_message: MessageTokens | None = None  # chat's score_final_message

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p.token_ids) for p in self.prompts)


def admit_completion(request: CompletionRequest, caps: Capabilities, ingress: IngressConfig,
                     vocab: Vocabulary, caller: Caller) -> Admitted:
    """/v1/completions: every check, then the prompts tokenized and their engine requests."""
    check_completion(request, caps, ingress, vocab)
    bias = logit_bias(request, vocab.logits_size)
    prompts = prompt_inputs(request.prompt, vocab, ingress.max_batch_prompts)
    check_prompts(prompts, request, caps)
    lengths = [len(p.token_ids) for p in prompts]
    full_vocab = request.prompt_logprobs == -1
    return Admitted(prompts, [engine_request(p, request, caps, caller, bias) for p in prompts],
                    scored_tokens=sum(scored_prompt_tokens(request, length) for length in lengths),
                    full_vocab_positions=sum(length - 1 for length in lengths) if full_vocab else 0)


def admit_chat(request: ChatRequest, caps: Capabilities, ingress: IngressConfig,
               vocab: Vocabulary, caller: Caller) -> Admitted:
    """/v1/chat/completions: every check, then the messages rendered, the final message's
    tokens found when they are scored, and the engine request."""
    check_chat(request, caps, ingress, vocab)
    bias = logit_bias(request, vocab.logits_size)
    prompt = render_chat(request.messages, vocab, request)
    check_prompts([prompt], request, caps, "messages")
    final = (final_message_tokens(request.messages, vocab, request, prompt)
             if request.score_final_message else None)
    rows_from = chat_rows_from(request, final)
    length = len(prompt.token_ids)
    scored = 0 if rows_from is None else length - rows_from
    check_scored_count(scored, "the conversation", caps)
    engine = sampling_request(prompt, request, caps, caller, bias, chat_prompt_logprobs(request, final),
                              rows_from or 0)
    return Admitted([prompt], [engine], scored_tokens=scored, final_message=final,
                    full_vocab_positions=length - 1 if request.prompt_logprobs == -1 else 0)


def chat_rows_from(request: ChatRequest, final: MessageTokens | None) -> int | None:
    """The first prompt position a chat answer scores: its `prompt_logprobs`' or its final
    message's; None when it scores none."""
    starts = []
    if request.prompt_width() is not None:
        starts.append(request.logprob_start_len or 0)  # never set with -1 (check_chat)
    if final:
        starts.append(final.positions.start)
    return min(starts) if starts else None


def chat_prompt_logprobs(request: ChatRequest, final: MessageTokens | None) -> int | None:
    """The engine's prompt top-k for a chat answer: -1, or the widest it shows (0 with labels,
    which the engine lists in place of a top-k)."""
    if request.prompt_logprobs == -1:
        return -1
    widths = [w for w in (request.prompt_width(), request.scored_width() if final else None) if w is not None]
    if not widths:
        return None
    return 0 if request.logprob_token_ids else max(widths)


def prompt_inputs(prompt: str | list, vocab: Vocabulary, max_batch_prompts: int) -> list[PromptInput]:
    """One PromptInput per prompt of the request, tokenized or decoded."""
    single = isinstance(prompt, str) or isinstance(prompt[0], int)
    items = [prompt] if single else prompt
    if len(items) > max_batch_prompts:
        raise invalid("prompt", f"a batch holds at most {max_batch_prompts} prompts, "
                      f"got {len(items)}", "batch_too_large")
    return [to_prompt_input(item, index, vocab) for index, item in enumerate(items)]


def to_prompt_input(item: str | list[int], index: int, vocab: Vocabulary) -> PromptInput:
    if isinstance(item, str):
        token_ids, spans = vocab.encode(item)
        return PromptInput(token_ids, item, spans)
    check_token_ids(item, vocab, "prompt", f"in {prompt_name(index)}")
    pieces = id_prompt_pieces(item, vocab)
    return PromptInput(list(item), "".join(pieces.tokens), pieces=pieces)


def check_token_ids(token_ids: list[int], vocab: Vocabulary, param: str, where: str) -> None:
    outside = next((t for t in token_ids if t >= vocab.size), None)
    if outside is not None:
        raise invalid(param, f"token id {outside} {where} is outside the vocabulary "
                      f"(0 to {vocab.size - 1})", "invalid_token_id")


def prompt_name(index: int) -> str:
    return f"prompt {index}" if index else "the prompt"


def span_start(request: CompletionRequest) -> int | None:
    """First prompt position whose logprobs go into `choices[i].logprobs`, or None."""
    if request.logprob_start_len is not None:
        return request.logprob_start_len
    return 0 if request.echo and request.top_k() is not None else None


def rules(caps: Capabilities | None, ingress: IngressConfig, chat: bool = False) -> dict[str, str]:
    """The field rules of an endpoint for a model (None: the model is not known yet)."""
    write = chat_rules if chat else completion_rules
    if caps is None:
        return write("capabilities.max_logprobs", ingress.max_n, "capabilities.max_logprob_token_ids")
    return write(caps.max_logprobs, ingress.max_n, caps.max_logprob_token_ids)


def check_sampling(request: SamplingRequest, caps: Capabilities, ingress: IngressConfig,
                   vocab: Vocabulary, allowed: dict[str, str]) -> None:
    """The checks on the fields both endpoints share."""
    if request.n > ingress.max_n:
        raise field_error("n", allowed, request.n)
    if request.stream_options is not None and not request.stream:
        raise invalid("stream_options", "stream_options needs stream: true", "invalid_combination")
    labels = request.logprob_token_ids
    if labels is not None:
        if len(labels) > caps.max_logprob_token_ids or len(set(labels)) != len(labels):
            raise field_error("logprob_token_ids", allowed, labels)
        check_token_ids(labels, vocab, "logprob_token_ids", "in logprob_token_ids")


def check_completion(request: CompletionRequest, caps: Capabilities, ingress: IngressConfig,
                     vocab: Vocabulary) -> None:
    """The checks that need the model's capabilities but not the prompt's tokens."""
    allowed = rules(caps, ingress)
    check_sampling(request, caps, ingress, vocab, allowed)
    if request.logprobs is not None and request.logprobs > caps.max_logprobs:
        raise field_error("logprobs", allowed, request.logprobs)
    if request.prompt_logprobs is not None and request.prompt_logprobs > caps.max_logprobs:
        raise field_error("prompt_logprobs", allowed, request.prompt_logprobs)
    check_labels_alone(request, {"logprobs": request.logprobs,
                                 "prompt_logprobs": request.prompt_logprobs is not None})
    check_streaming(request, {"echo": request.echo})
    if request.best_of not in (None, request.n):
        raise invalid("best_of", f"best_of must be absent or equal to n ({request.n}), got "
                      f"{request.best_of}: choosing the best of several samples is not supported",
                      "unsupported_parameter")
    if request.suffix:
        raise invalid("suffix", "suffix must be absent or empty: insertion is not supported",
                      "unsupported_parameter")


def check_chat(request: ChatRequest, caps: Capabilities, ingress: IngressConfig,
               vocab: Vocabulary) -> None:
    allowed = rules(caps, ingress, chat=True)
    check_sampling(request, caps, ingress, vocab, allowed)
    for field in ("top_logprobs", "prompt_logprobs"):
        value = getattr(request, field)
        if value is not None and value > caps.max_logprobs:
            raise field_error(field, allowed, value)
    check_labels_alone(request, {"top_logprobs": request.top_logprobs,
                                 "prompt_logprobs": request.prompt_logprobs is not None})
    check_streaming(request, {"echo": request.echo, "score_final_message": request.score_final_message})
    if request.prompt_logprobs == -1 and request.logprob_start_len is not None:
        raise invalid("logprob_start_len", "prompt_logprobs: -1 returns every position's whole "
                      "distribution: leave logprob_start_len out", "invalid_combination")
    both = (request.max_tokens, request.max_completion_tokens)
    if None not in both and both[0] != both[1]:
        raise invalid("max_completion_tokens", f"max_tokens ({both[0]}) and max_completion_tokens "
                      f"({both[1]}) disagree: send one", "invalid_combination")


def check_labels_alone(request: SamplingRequest, others: dict[str, object]) -> None:
    """logprob_token_ids stands in for a top-k: asking for both is a mistake."""
    if request.logprob_token_ids is None:
        return
    for field, value in others.items():
        if value:
            raise invalid(field, f"{field} cannot be combined with logprob_token_ids: the "
                          "labels' logprobs replace the top-k; leave it out (or 0)",
                          "invalid_combination")


def check_streaming(request: SamplingRequest, scoring: dict[str, bool]) -> None:
    """Prompt scores come in one response: a stream carries generated tokens only."""
    if not request.stream:
        return
    scoring = {**scoring, "prompt_logprobs": request.prompt_logprobs is not None,
               "logprob_start_len": request.logprob_start_len is not None}
    for field, asked in scoring.items():
        if asked:
            raise invalid("stream", f"stream: true cannot be combined with {field}: prompt "
                          "scores come in one response; leave stream out", "invalid_combination")


def logit_bias(request: SamplingRequest, vocab_size: int) -> dict[int, float] | None:
    """logit_bias with its keys checked and turned into token ids."""
    if not request.logit_bias:
        return None
    bias = {}
    for key, value in request.logit_bias.items():
        token_id = int(key) if key.isascii() and key.isdecimal() else -1
        if not 0 <= token_id < vocab_size:
            raise invalid("logit_bias", f"logit_bias keys must be token ids from 0 to "
                          f"{vocab_size - 1} written as strings, got {key!r}", "invalid_token_id")
        bias[token_id] = value
    return bias


def check_prompts(prompts: list[PromptInput], request: SamplingRequest, caps: Capabilities,
                  prompt_field: str = "prompt") -> None:
    """The checks on the tokenized prompts."""
    for index, prompt in enumerate(prompts):
        check_prompt(prompt, prompt_name(index), request, caps, prompt_field)
    total = sum(len(p.token_ids) for p in prompts)
    if request.prompt_logprobs == -1 and total > caps.full_vocab_max_prompt_tokens:
        # The cap bounds the rows one request holds, so a batch counts as a whole.
        counted = "the prompt has" if len(prompts) == 1 else "the batch's prompts have together"
        raise invalid(prompt_field, f"{counted} {total} tokens; prompt_logprobs: -1 (the full "
                      f"vocabulary) takes at most {caps.full_vocab_max_prompt_tokens} per request "
                      "(capabilities.full_vocab_max_prompt_tokens): use a top-k or split the batch",
                      "full_vocab_prompt_too_long")


def check_prompt(prompt: PromptInput, where: str, request: SamplingRequest, caps: Capabilities,
                 prompt_field: str) -> None:
    length = len(prompt.token_ids)
    if length == 0:
        raise invalid(prompt_field, f"{where} is empty: it tokenizes to no tokens")
    field, limit = request.token_limit()
    if limit is None and length >= caps.max_model_len:
        raise invalid(prompt_field, f"{where} has {length} tokens: it leaves no room to generate "
                      f"within the model's context of {caps.max_model_len} tokens",
                      "context_length_exceeded")
    if limit is not None and length + limit > caps.max_model_len:
        raise invalid(field, f"{where} has {length} tokens and {field} is {limit}: together "
                      f"they exceed the model's context of {caps.max_model_len} tokens",
                      "context_length_exceeded")
    start = request.logprob_start_len
    if start is not None and start >= length:
        raise invalid("logprob_start_len", f"logprob_start_len must be below the length of "
                      f"{where} ({length} tokens), got {start}")
    if isinstance(request, CompletionRequest):
        check_scored_count(scored_prompt_tokens(request, length), where, caps, prompt_field)


def check_scored_count(scored: int, where: str, caps: Capabilities, prompt_field: str = "messages") -> None:
    if scored > caps.max_scored_tokens:
        raise invalid(prompt_field, f"{where} asks to score {scored} tokens; the model scores at "
                      f"most {caps.max_scored_tokens} per prompt (capabilities.max_scored_tokens)",
                      "too_many_scored_tokens")


def scored_prompt_tokens(request: CompletionRequest, length: int) -> int:
    if request.prompt_logprobs is not None:
        return length
    start = span_start(request)
    return 0 if start is None else length - start


def engine_prompt_logprobs(request: CompletionRequest) -> int | None:
    """The prompt top-k that serves both prompt_logprobs and the echoed or scored span."""
    if request.prompt_logprobs == -1:
        return -1
    wanted = [request.prompt_logprobs]
    if span_start(request) is not None:
        wanted.append(request.top_k() or 0)
    wanted = [k for k in wanted if k is not None]
    return max(wanted) if wanted else None


def first_shown_row(request: CompletionRequest) -> int:
    """The first prompt position the answer shows: a span's start, unless prompt_logprobs
    asks for every row."""
    if request.prompt_logprobs is not None:
        return 0
    return span_start(request) or 0


def is_greedy(request: SamplingRequest) -> bool:
    """As vLLM decides: below its sampling epsilon (serve_app.vllm_constants)."""
    return request.temperature < SAMPLING_EPS


def engine_request(prompt: PromptInput, request: CompletionRequest, caps: Capabilities, caller: Caller,
                   bias: dict[int, float] | None = None) -> EngineRequest:
    """A completion prompt's engine request."""
    return sampling_request(prompt, request, caps, caller, bias, engine_prompt_logprobs(request),
                            first_shown_row(request))


def sampling_request(prompt: PromptInput, request: SamplingRequest, caps: Capabilities, caller: Caller,
                     bias: dict[int, float] | None, prompt_logprobs: int | None,
                     prompt_rows_from: int) -> EngineRequest:
    stops = [request.stop] if isinstance(request.stop, str) else request.stop or []
    _, limit = request.token_limit()
    return EngineRequest(
        prompt_token_ids=prompt.token_ids,
        max_tokens=limit or caps.max_model_len - len(prompt.token_ids),
        temperature=request.temperature,
        top_p=request.top_p,
        # vLLM refuses n > 1 when greedy: the n choices are the same one, made once.
        n=1 if is_greedy(request) else request.n,
        seed=request.seed,
        stop=[s for s in stops if s],  # an empty stop string stops nothing
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        logit_bias=bias,
        logprobs=request.top_k(),
        prompt_logprobs=prompt_logprobs,
        prompt_rows_from=prompt_rows_from,
        logprob_token_ids=request.logprob_token_ids,
        tenant=caller.tenant,
        priority=caller.priority,
        adapter=caller.adapter,
    )
