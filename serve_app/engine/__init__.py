"""The engine side: the model replica deployment on vLLM's AsyncLLM, the wire types it trades
with the ingress (compact arrays, never per-entry objects), and `vllm_fence`, the one package
that touches vLLM's private parts (a module for each process it runs in). Imports `text`,
`store`, `config`, `observe`; never the HTTP layers."""
