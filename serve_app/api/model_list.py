"""GET /v1/models: OpenAI's model objects, with the capabilities a tenant has on each."""

from serve_app.config import Capabilities, ModelConfig
from serve_app.text.vocabulary import Vocabulary


def model_card(model: ModelConfig, caps: Capabilities, created: int, vocab: Vocabulary) -> dict:
    return {
        "id": model.name,
        "object": "model",
        "created": created,
        "owned_by": "probserve",
        "max_model_len": caps.max_model_len,
        # Whether /v1/chat/completions serves it: its tokenizer has a chat template.
        "chat": vocab.chat_template is not None,
        "capabilities": caps.model_dump(),
    }
