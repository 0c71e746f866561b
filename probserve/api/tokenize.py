"""POST /tokenize and /detokenize, in vLLM's shape: clients compute `logprob_start_len` and
label ids with the server's own tokenizer and chat template."""

from probserve.api.admission import check_token_ids, render_chat
from probserve.api.request_models import DetokenizeRequest, TokenizeRequest
from probserve.errors import invalid
from probserve.text.pieces import id_prompt_pieces
from probserve.text.vocabulary import Vocabulary


def tokenize(request: TokenizeRequest, vocab: Vocabulary) -> list[int]:
    """A prompt's token ids as /v1/completions reads it, or messages' as chat renders them."""
    if (request.prompt is None) == (request.messages is None):
        raise invalid("prompt", "send either prompt (a string) or messages (a chat)")
    if request.messages is not None:
        if request.add_special_tokens is not None:
            raise invalid("add_special_tokens", "add_special_tokens applies to a prompt: the "
                          "chat template writes the special tokens of messages", "invalid_combination")
        generation_prompt = request.add_generation_prompt is not False
        return render_chat(request.messages, vocab, add_generation_prompt=generation_prompt).token_ids
    if request.add_generation_prompt is not None:
        raise invalid("add_generation_prompt", "add_generation_prompt applies to messages, not "
                      "to a prompt", "invalid_combination")
    return vocab.encode(request.prompt, add_special_tokens=request.add_special_tokens is not False)[0]


def detokenize(request: DetokenizeRequest, vocab: Vocabulary) -> str:
    """The text of token ids, as an echoed token-id prompt reads (special tokens written)."""
    check_token_ids(request.tokens, vocab, "tokens", "in tokens")
    return "".join(id_prompt_pieces(request.tokens, vocab).tokens)
