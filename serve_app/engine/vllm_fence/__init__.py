"""The fence around vLLM's and Ray's private parts: every place probserve relies on more than
their public APIs is listed and owned here, checked at import (versions), at replica start
(self-checks) and by tests/unit/test_fence_*.py (signatures, constants, use sites).

Each module runs in one process:
- touch_points: in every process that imports the fence. The table (what each change is,
  items 1 to 9, and each private method, attribute and value it uses), the version check,
  and the plumbing that patches a touch point by its qualified name.
- worker: in vLLM's worker processes, every rank's, the model runner's and its sampler's
  (items 1, 2, 4, 10, 11, 13, 14).
- scheduler: in vLLM's engine core process, the scheduler's (item 3).
- front_end: in vLLM's front end, AsyncLLM in the replica's process (items 2, 5, 7).
- replica_start: in the replica's process, around its engine's start (item 8, self-checks).
- gloo: in each process that joins torch.distributed, vLLM's workers (item 12).
Ray Serve's items 6 and 9 are serve_app.front.replica_router's.
"""

from serve_app.engine.vllm_fence.gloo import one_gloo_device_per_process
from serve_app.engine.vllm_fence.scheduler import read_prefix_cache_up_to_limits
from serve_app.engine.vllm_fence.worker import (
    gather_marked_prompt_rows,
    keep_top_k_beside_labels,
    make_stage_inputs_when_first_needed,
    no_adapter_for_tokens_of_none,
    one_row_matmuls_as_two,
    seeded_cpu_samples_skip_discarded_steps,
)


def register() -> None:
    """The vLLM plugin's entry point (pyproject.toml, `vllm.general_plugins`): vLLM calls it in
    every process and each patch applies where its method runs; applying twice is a no-op."""
    gather_marked_prompt_rows()
    read_prefix_cache_up_to_limits()
    keep_top_k_beside_labels()
    make_stage_inputs_when_first_needed()
    no_adapter_for_tokens_of_none()
    seeded_cpu_samples_skip_discarded_steps()
    one_row_matmuls_as_two()
    one_gloo_device_per_process()
