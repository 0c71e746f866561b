"""GET /v1/models: OpenAI's model objects, with the capabilities a tenant has on each."""

from serve_app.config import Capabilities, Served
from serve_app.text.vocabulary import Vocabulary


def model_card(served: Served, caps: Capabilities, created: int, vocab: Vocabulary) -> dict:
    """A model's card, or an adapter's: `parent` names its base model (vLLM's field; never its
    folder, which vLLM shows as `root`)."""
    return {
        "id": served.name,
        "object": "model",
        "created": created,
        "owned_by": "probserve",
        "parent": served.model.name if served.adapter else None,
        "max_model_len": caps.max_model_len,
        # Whether /v1/chat/completions serves it: its tokenizer has a chat template.
        "chat": vocab.chat_template is not None,
        "capabilities": caps.model_dump(),
    }
