"""/v1/completions admission: a parsed request and a model's capabilities in, the checked,
tokenized prompts and the engine requests out. Every refusal happens here, before any replica.
"""

from dataclasses import dataclass

from serve_app.config import Capabilities, IngressConfig
from serve_app.errors import invalid
from serve_app.protocol import CompletionRequest, completion_rules, field_error
from serve_app.scoring import EngineRequest
from serve_app.vocabulary import Vocabulary

GREEDY_BELOW_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class PromptInput:
    token_ids: list[int]
    text: str


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
        return PromptInput(vocab.encode(item), item)
    outside = next((t for t in item if t >= vocab.size), None)
    if outside is not None:
        raise invalid("prompt", f"token id {outside} in {prompt_name(index)} is outside the "
                      f"vocabulary (0 to {vocab.size - 1})", "invalid_token_id")
    return PromptInput(list(item), vocab.decode(item))


def prompt_name(index: int) -> str:
    return f"prompt {index}" if index else "the prompt"


def span_start(request: CompletionRequest) -> int | None:
    """First prompt position whose logprobs go into `choices[i].logprobs`, or None."""
    if request.logprob_start_len is not None:
        return request.logprob_start_len
    return 0 if request.echo and request.logprobs is not None else None


def rules(caps: Capabilities | None, ingress: IngressConfig) -> dict[str, str]:
    """The field rules of /v1/completions for a model (None: the model is not known yet)."""
    return completion_rules(caps.max_logprobs if caps else "capabilities.max_logprobs",
                            ingress.max_n)


def check_request(request: CompletionRequest, caps: Capabilities, ingress: IngressConfig) -> None:
    """The checks that need the model's capabilities but not the prompt's tokens."""
    allowed = rules(caps, ingress)
    if request.logprobs is not None and request.logprobs > caps.max_logprobs:
        raise field_error("logprobs", allowed, request.logprobs)
    if request.prompt_logprobs is not None and request.prompt_logprobs > caps.max_logprobs:
        raise field_error("prompt_logprobs", allowed, request.prompt_logprobs)
    if request.n > ingress.max_n:
        raise field_error("n", allowed, request.n)
    check_streaming(request)
    if request.best_of not in (None, request.n):
        raise invalid("best_of", f"best_of must be absent or equal to n ({request.n}), got "
                      f"{request.best_of}: choosing the best of several samples is not supported",
                      "unsupported_parameter")
    if request.suffix:
        raise invalid("suffix", "suffix must be absent or empty: insertion is not supported",
                      "unsupported_parameter")


def check_streaming(request: CompletionRequest) -> None:
    if request.stream_options is not None and not request.stream:
        raise invalid("stream_options", "stream_options needs stream: true", "invalid_combination")
    if not request.stream:
        return
    scoring = {"echo": request.echo, "prompt_logprobs": request.prompt_logprobs is not None,
               "logprob_start_len": request.logprob_start_len is not None}
    for field, asked in scoring.items():
        if asked:
            raise invalid("stream", f"stream: true cannot be combined with {field}: prompt "
                          "scores come in one response; leave stream out", "invalid_combination")


def logit_bias(request: CompletionRequest, vocab_size: int) -> dict[int, float] | None:
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


def check_prompts(prompts: list[PromptInput], request: CompletionRequest, caps: Capabilities) -> None:
    """The checks on the tokenized prompts."""
    for index, prompt in enumerate(prompts):
        check_prompt(prompt, prompt_name(index), request, caps)
    total = sum(len(p.token_ids) for p in prompts)
    if request.prompt_logprobs == -1 and total > caps.full_vocab_max_prompt_tokens:
        # The cap bounds the rows one request holds, so a batch counts as a whole.
        counted = "the prompt has" if len(prompts) == 1 else "the batch's prompts have together"
        raise invalid("prompt", f"{counted} {total} tokens; prompt_logprobs: -1 (the full "
                      f"vocabulary) takes at most {caps.full_vocab_max_prompt_tokens} per request "
                      "(capabilities.full_vocab_max_prompt_tokens): use a top-k or split the batch",
                      "full_vocab_prompt_too_long")


def check_prompt(prompt: PromptInput, where: str, request: CompletionRequest,
                 caps: Capabilities) -> None:
    length = len(prompt.token_ids)
    if length == 0:
        raise invalid("prompt", f"{where} is empty: it tokenizes to no tokens")
    if length + request.max_tokens > caps.max_model_len:
        raise invalid("max_tokens", f"{where} has {length} tokens and max_tokens is "
                      f"{request.max_tokens}: together they exceed the model's context of "
                      f"{caps.max_model_len} tokens", "context_length_exceeded")
    start = request.logprob_start_len
    if start is not None and start >= length:
        raise invalid("logprob_start_len", f"logprob_start_len must be below the length of "
                      f"{where} ({length} tokens), got {start}")
    scored = scored_prompt_tokens(request, length)
    if scored > caps.max_scored_tokens:
        raise invalid("prompt", f"{where} asks to score {scored} tokens; the model scores at most "
                      f"{caps.max_scored_tokens} per prompt (capabilities.max_scored_tokens)",
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
        wanted.append(request.logprobs or 0)
    wanted = [k for k in wanted if k is not None]
    return max(wanted) if wanted else None


def is_greedy(request: CompletionRequest) -> bool:
    """vLLM samples greedily below this temperature (vllm.sampling_params._SAMPLING_EPS)."""
    return request.temperature < GREEDY_BELOW_TEMPERATURE


def engine_request(prompt: PromptInput, request: CompletionRequest,
                   bias: dict[int, float] | None = None) -> EngineRequest:
    stops = [request.stop] if isinstance(request.stop, str) else request.stop or []
    stop = [s for s in stops if s]  # an empty stop string stops nothing
    return EngineRequest(
        prompt_token_ids=prompt.token_ids,
        max_tokens=request.max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        # vLLM refuses n > 1 when greedy: the n choices are the same one, made once.
        n=1 if is_greedy(request) else request.n,
        seed=request.seed,
        stop=stop,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        logit_bias=bias,
        logprobs=request.logprobs,
        prompt_logprobs=engine_prompt_logprobs(request),
    )
