"""POST /tokenize, POST /detokenize and GET /tokenizer_info, in vLLM's shape: clients compute
`logprob_start_len` and label ids with the server's own tokenizer and chat template, and
lm-evaluation-harness's remote tokenizer reads the tokenizer's configuration."""

from serve_app.api.admission import check_token_ids
from serve_app.api.conversation import render_chat
from serve_app.api.request_models import DetokenizeRequest, TokenizeRequest
from serve_app.errors import invalid
from serve_app.text.pieces import id_prompt_pieces
from serve_app.text.vocabulary import Vocabulary

TEMPLATE_FIELDS = ("add_generation_prompt", "continue_final_message", "chat_template_kwargs")
# Configuration that says where the tokenizer's files are on this server and how they were
# loaded: nothing a client can use, and paths a tenant has no business seeing.
LOADING_FIELDS = frozenset({"name_or_path", "vocab_file", "merges_file", "tokenizer_file", "is_local",
                            "local_files_only"})
SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")


def tokenize(request: TokenizeRequest, vocab: Vocabulary) -> list[int]:
    """A prompt's token ids as /v1/completions reads it, or messages' as chat renders them."""
    if (request.prompt is None) == (request.messages is None):
        raise invalid("prompt", "send either prompt (a string) or messages (a chat)")
    if request.messages is not None:
        return render_chat(request.messages, vocab, request,
                           add_special_tokens=request.add_special_tokens is True).token_ids
    for field in TEMPLATE_FIELDS:
        if field in request.model_fields_set:
            raise invalid(field, f"{field} applies to messages, not to a prompt", "invalid_combination")
    return vocab.encode(request.prompt, add_special_tokens=request.add_special_tokens is not False)[0]


def tokenize_response(request: TokenizeRequest, vocab: Vocabulary, max_model_len: int) -> dict:
    """`{count, max_model_len, tokens}`, and `token_strs` (the vocabulary's own strings, as
    vLLM lists them) when asked."""
    token_ids = tokenize(request, vocab)
    body = {"count": len(token_ids), "max_model_len": max_model_len, "tokens": token_ids}
    if request.return_token_strs:
        body["token_strs"] = vocab.tokenizer.convert_ids_to_tokens(token_ids)
    return body


def detokenize(request: DetokenizeRequest, vocab: Vocabulary) -> str:
    """The text of token ids, as an echoed token-id prompt reads (special tokens written)."""
    check_token_ids(request.tokens, vocab, "tokens", "in tokens")
    return "".join(id_prompt_pieces(request.tokens, vocab).tokens)


def json_ready(value: object) -> object:
    """A configuration value as JSON holds it: a special token as its text, as vLLM writes it."""
    if hasattr(value, "content"):
        return value.content
    if isinstance(value, dict):
        return {str(key): json_ready(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(item) for item in value]
    return value


def tokenizer_info(vocab: Vocabulary, max_model_len: int) -> dict:
    """The tokenizer's configuration, as vLLM's GET /tokenizer_info returns it, with the
    context this service serves as `model_max_length` (tokenizer files often hold a
    placeholder of 10^30 there) and without the server's file paths."""
    tokenizer = vocab.tokenizer
    info = {key: json_ready(value) for key, value in tokenizer.init_kwargs.items()
            if key not in LOADING_FIELDS}
    info.update({name: getattr(tokenizer, name) for name in SPECIAL_TOKENS
                 if getattr(tokenizer, name, None) is not None})
    info["model_max_length"] = max_model_len
    info["tokenizer_class"] = type(tokenizer).__name__
    if vocab.chat_template:
        info["chat_template"] = vocab.chat_template
    return info
