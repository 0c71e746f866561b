"""probserve: an OpenAI-compatible log-probability scoring service on Ray Serve and vLLM."""
