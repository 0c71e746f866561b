"""The scheduler's patch on vLLM's own KV cache manager: a scored span's prefix cache hit,
cut at its limit in whole blocks."""

import pytest
import torch

from serve_app.engine.vllm_fence import register
from serve_app.engine.vllm_fence.touch_points import PREFIX_CACHE_LIMIT

BLOCK = 4


def kv_cache_manager():
    """vLLM's prefix-caching manager over one group of 4-token blocks, none computed yet."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    init_none_hash(sha256)
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    config = KVCacheConfig(num_blocks=20, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    return KVCacheManager(config, max_model_len=64, scheduler_block_size=BLOCK, hash_block_size=BLOCK,
                          enable_caching=True)


def scheduler_request(name: str, prompt: list[int], **params):
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request

    return Request(name, prompt, SamplingParams(max_tokens=1, **params), None,
                   block_hasher=get_request_block_hasher(BLOCK, sha256))


@pytest.mark.parametrize("limit, hit", [(6, 4), (8, 8), (3, 0), (20, 12)])
def test_a_spans_cache_hit_stops_at_its_limit_in_whole_blocks(limit, hit):
    register()
    manager, prompt = kv_cache_manager(), list(range(10, 23))  # 13 tokens: 3 whole blocks
    first = scheduler_request("first", prompt)
    nothing_cached, _, _ = manager.get_computed_blocks(first)
    manager.allocate_slots(first, len(prompt), 0, nothing_cached)  # computed, and cached
    span = scheduler_request("span", prompt, prompt_logprobs=1, skip_reading_prefix_cache=False,
                             extra_args={PREFIX_CACHE_LIMIT: limit})
    blocks, tokens, _ = manager.get_computed_blocks(span)
    assert (tokens, len(blocks.blocks[0]) * BLOCK) == (hit, hit)
    assert manager.get_computed_blocks(scheduler_request("plain", prompt))[1] == 12
