"""The public API's logic, free of HTTP and Ray: request models and field rules, admission
(every check, then the engine requests), response shaping for completions, chat and streams,
/tokenize and the OpenAPI document. Imports `text`, `engine.wire`, `config`, `errors`."""
