"""Values probserve copies from vLLM 0.32 instead of importing vLLM where it is not loaded (the
ingress, the pool). serve_app.engine.vllm_fence.touch_points names where each comes from,
and tests/unit/test_fence_touch_points.py checks each against vLLM's own."""

# vLLM samples greedily below this temperature (vllm.sampling_params._SAMPLING_EPS).
SAMPLING_EPS = 1e-5
# JSON has no -Infinity: vLLM's OpenAI shapes floor a logprob here (ChatCompletionLogProb.logprob).
NEG_INF_LOGPROB = -9999.0
# vLLM's sampler reserves this many label columns per request (MAX_LOGPROB_TOKEN_IDS).
MAX_LOGPROB_TOKEN_IDS = 128
# The max_lora_rank values vLLM accepts (vllm.config.lora.MaxLoRARanks).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
