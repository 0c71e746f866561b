"""probserve: the log-probabilities a language model assigns to text, served OpenAI-style on
Ray Serve and vLLM.

Subpackages by concern, lowest first; a module imports only from its own layer or below
(tests/unit/test_layers.py holds the order):

| layer | what lives there |
| --- | --- |
| `text`, `store` | token pieces and the vocabulary; the model and adapter store and PROBSERVE_HOME |
| `config`, `errors`, `gate`, `parallel`, `adapters`, `vllm_constants` | schema, errors, waits, splits, LoRA |
| `batch_invariance` (the same layer) | where vLLM's batch-invariant mode runs |
| `observe` | metrics, request records and the request log, replica availability |
| `engine` | the model replica on vLLM, the fence around vLLM's private parts, the wire types |
| `tenants` | API keys, rate limits and in-flight bounds, usage |
| `fullvocab` | full-vocabulary JSON and npy writers, gzip, the serializer pool, the body relay |
| `api` | request models and admission, response shaping, streaming, tokenize, OpenAPI |
| `batch` | OpenAI's Files and Batch APIs: storage, uploads, batch lines and records, the batch runner |
| `front` | the ingress deployment: HTTP plumbing, the replica client, the handlers |
| `ops` | the app builder, local Ray and cluster join, the CLI, generated k8s and dashboard |
"""
