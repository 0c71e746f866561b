"""The full vocabulary (`prompt_logprobs: -1`): rows written as JSON or `.npy` by the serializer
pool deployment, one gzip member of deflated parts, and the relay that streams a body in
order. Imports `engine.wire`, `text`, `config`, `observe`."""
