"""Conversations: messages rendered with the model's own chat template, as transformers'
`apply_chat_template` renders them and vLLM tokenizes them, and where the final message's
text sits in the rendered prompt (`score_final_message`).

The final message is found by rendering the conversation once more with its text replaced
by a marker: what the template writes before and after the marker is what it writes around
the message, whatever the template is. A template that trims the text (Llama 3's) leaves
the trimmed text in between, and offsets count from the message's text as it was sent.
"""

from dataclasses import dataclass

from jinja2 import TemplateError

from serve_app.api.prompts import PromptInput
from serve_app.api.request_models import ChatMessage, ChatTemplateOptions
from serve_app.errors import invalid
from serve_app.text.pieces import Pieces, string_pieces
from serve_app.text.vocabulary import Vocabulary

# Private-use characters: no template trims or rewrites them, no message holds them by chance.
MARKER = "\ue000probserve final message\ue000"
# apply_chat_template's own parameters and what the template is given besides: a variable of
# the same name would replace the request's own field or break the rendering.
RESERVED_VARIABLES = frozenset({
    "messages", "conversation", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
})


def plain_messages(messages: list[ChatMessage]) -> list[dict]:
    return [{"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})}
            for m in messages]


def check_options(options: ChatTemplateOptions) -> None:
    if options.continue_final_message and options.add_generation_prompt:
        raise invalid("continue_final_message", "continue_final_message and add_generation_prompt "
                      "cannot both be true: the final message is either continued or followed by "
                      "the assistant's opening", "invalid_combination")
    reserved = sorted(RESERVED_VARIABLES & (options.chat_template_kwargs or {}).keys())
    if reserved:
        raise invalid("chat_template_kwargs", f"chat_template_kwargs cannot set {', '.join(reserved)}: "
                      "use the request's own fields", "invalid_chat_template_kwargs")


def render_text(messages: list[dict], vocab: Vocabulary, options: ChatTemplateOptions) -> str:
    if not vocab.chat_template:
        raise invalid("model", "this model has no chat template, so messages cannot be "
                      "rendered: send a prompt to /v1/completions instead", "no_chat_template")
    try:
        return vocab.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=options.generation_prompt(),
            continue_final_message=options.continue_final_message,
            **(options.chat_template_kwargs or {}))
    except (TemplateError, ValueError, TypeError) as error:
        raise invalid("messages", f"the model's chat template cannot render these messages: "
                      f"{error}", "chat_template_error") from None


def render_chat(messages: list[ChatMessage], vocab: Vocabulary, options: ChatTemplateOptions,
                add_special_tokens: bool = False) -> PromptInput:
    """The messages rendered and tokenized; the template writes the special tokens (BOS
    included), so none are added unless asked."""
    check_options(options)
    text = render_text(plain_messages(messages), vocab, options)
    token_ids, spans = vocab.encode(text, add_special_tokens=add_special_tokens)
    return PromptInput(token_ids, text, spans)


@dataclass(frozen=True)
class MessageText:
    """Where a message's text is in a rendered prompt: [start, end), in code points; `lead`
    is how many of its first characters the template dropped (whitespace it trimmed)."""

    start: int
    end: int
    lead: int


def final_message_text(messages: list[ChatMessage], vocab: Vocabulary, options: ChatTemplateOptions,
                       rendered: str) -> MessageText:
    plain = plain_messages(messages)
    content = plain[-1]["content"]
    marked = render_text([*plain[:-1], {**plain[-1], "content": MARKER}], vocab, options)
    if marked.count(MARKER) == 1:
        before, after = marked.split(MARKER)
        end = len(rendered) - len(after)
        if rendered.startswith(before) and rendered.endswith(after) and end >= len(before):
            written = rendered[len(before):end]
            lead = content.find(written)
            if written.strip() == content.strip() and lead >= 0:
                return MessageText(len(before), end, lead)
    raise invalid("score_final_message", "the model's chat template does not write the final "
                  "message's text as it was sent, so its tokens cannot be told apart: score the "
                  "prompt with prompt_logprobs instead", "final_message_not_found")


@dataclass(frozen=True)
class MessageTokens:
    """A message's tokens: their prompt positions, and each one's piece of the message's text
    (pieces that straddle its edges are cut there) with the piece's offset in that text."""

    positions: range
    pieces: Pieces

    def __bool__(self) -> bool:
        return bool(self.positions)


def message_tokens(prompt: PromptInput, text: MessageText, vocab: Vocabulary) -> MessageTokens:
    """The tokens whose text overlaps the message's, in order; a token inside one character
    (a byte token) belongs where the character does."""
    pieces = string_pieces(prompt.text, prompt.spans, prompt.token_ids, vocab)
    ends = [*pieces.offsets[1:], len(prompt.text)]
    inside = [i for i, (start, end) in enumerate(zip(pieces.offsets, ends, strict=True))
              if (start < text.end and end > text.start) or (start == end and text.start <= start < text.end)]
    found = Pieces()
    for i in inside:
        start, end = max(pieces.offsets[i], text.start), min(ends[i], text.end)
        found.add(prompt.text[start:end], start - text.start + text.lead)
    return MessageTokens(range(inside[0], inside[-1] + 1) if inside else range(0), found)


def final_message_tokens(messages: list[ChatMessage], vocab: Vocabulary, options: ChatTemplateOptions,
                         prompt: PromptInput) -> MessageTokens:
    tokens = message_tokens(prompt, final_message_text(messages, vocab, options, prompt.text), vocab)
    if tokens.positions and tokens.positions[0] == 0:
        raise invalid("score_final_message", "the final message's first token begins the prompt: "
                      "nothing precedes it, so it has no log-probability", "final_message_not_found")
    return tokens
