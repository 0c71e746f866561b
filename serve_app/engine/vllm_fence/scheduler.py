"""In vLLM's engine core process, its scheduler's: a scored span reads the prefix cache up to
its limit (item 3 of serve_app.engine.vllm_fence.touch_points). register() installs it."""

from serve_app.engine.vllm_fence.touch_points import PREFIX_CACHE_LIMIT, original, patched


def prefix_cache_limit(request) -> int | None:
    """The most prompt tokens a scheduler's request may read from the prefix cache, if capped."""
    extra_args = (request.sampling_params and request.sampling_params.extra_args) or {}
    return extra_args.get(PREFIX_CACHE_LIMIT)


def aligned_hit(hit: int, hit_blocks: int, limit: int) -> int:
    """The longest hit of whole blocks within `limit` tokens (hits are whole blocks)."""
    block_size = hit // hit_blocks
    return limit - limit % block_size


def read_prefix_cache_up_to_limits() -> None:
    """A scored span's prefix cache hit, cut at its limit (item 3)."""
    lookup = original("KVCacheManager.get_computed_blocks")

    def get_computed_blocks_within_limit(self, request):
        blocks, hit, boundary = lookup(self, request)
        limit = prefix_cache_limit(request)
        if limit is None or hit <= limit:
            return blocks, hit, boundary
        if len(blocks.blocks) != 1:  # several KV cache groups (hybrid models): compute it all
            return self.empty_kv_cache_blocks, 0, 0
        kept = aligned_hit(hit, len(blocks.blocks[0]), limit)
        return self.truncate_computed_blocks(blocks, kept), kept, 0

    patched("KVCacheManager.get_computed_blocks", get_computed_blocks_within_limit)
