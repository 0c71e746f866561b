"""A model split across engine workers: its layout checked against the model's config, the
executor chosen, the placement group its replica reserves, the cores each CPU worker gets."""

import json
import os

import pytest
from pydantic import ValidationError

from serve_app.config import AppConfig, ModelConfig, model_deployment_name
from serve_app.engine.vllm_adapter import compute_in_the_engine_core
from serve_app.parallel import (
    MULTIPROCESS,
    RAY,
    UNIPROCESS,
    Parallelism,
    cpu_binding,
    executor_backend,
    placement,
)
from serve_app.store.model_store import TINY, embedded_model_path
from tests.unit.test_deployments import deployments

LLAMA_70B = {"num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 80}
GPU_WORKER = {"num_cpus": 4, "num_gpus": 1, "memory": 64 << 30, "resources": {"probserve-model-big": 1}}
CPU_WORKER = {"num_cpus": 0.5}


@pytest.mark.parametrize(("tensor", "pipeline"), [(1, 1), (8, 1), (4, 2), (8, 2), (16, 1), (64, 80)])
def test_layouts_that_split_heads_and_layers_evenly_fit(tensor, pipeline):
    assert Parallelism(tensor, pipeline).problems(LLAMA_70B) == []


@pytest.mark.parametrize(("tensor", "pipeline", "problem"), [
    (3, 1, "its 64 attention heads do not divide by tensor_parallel_size 3"),
    (12, 1, "its 8 KV heads neither divide by tensor_parallel_size 12 nor divide it"),
    (1, 3, "its 80 layers do not divide by pipeline_parallel_size 3 (uneven stages: the largest "
           "sets the pace)"),
])
def test_a_layout_that_does_not_fit_is_named(tensor, pipeline, problem):
    assert problem in Parallelism(tensor, pipeline).problems(LLAMA_70B)


def test_a_multimodal_config_is_read_from_its_text_config():
    nested = {"text_config": {"num_attention_heads": 4, "num_hidden_layers": 2}}
    assert Parallelism(3, 1).problems(nested) == [
        "its 4 attention heads do not divide by tensor_parallel_size 3",
        "its 4 KV heads neither divide by tensor_parallel_size 3 nor divide it"]


def test_the_model_folder_is_checked_with_the_model_s_name(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_70B))
    Parallelism(8, 2).check_model_folder("big", tmp_path)
    with pytest.raises(ValueError, match=r"model 'big' cannot be split 3 x 1 \(tensor x pipeline\): its 64"):
        Parallelism(3, 1).check_model_folder("big", tmp_path)
    with pytest.raises(ValueError, match="no config.json"):
        Parallelism(2, 1).check_model_folder("big", tmp_path / "missing")
    Parallelism(1, 1).check_model_folder("big", tmp_path / "missing")  # one worker: nothing to check


def test_the_application_refuses_a_layout_the_model_cannot_take():
    models = [{"name": TINY, "tensor_parallel_size": 3}]  # 4 heads
    with pytest.raises(ValueError, match=r"model 'tiny-llama' cannot be split 3 x 1"):
        deployments({"models": models})
    assert embedded_model_path(TINY).is_dir()  # the check read the real folder


@pytest.mark.parametrize(("tensor", "pipeline", "worker", "chosen", "backend"), [
    (1, 1, GPU_WORKER, None, None),
    (8, 1, GPU_WORKER, None, MULTIPROCESS),
    (8, 2, GPU_WORKER, None, RAY),
    (1, 2, CPU_WORKER, None, MULTIPROCESS),
    (8, 1, GPU_WORKER, RAY, RAY),
    (4, 2, GPU_WORKER, MULTIPROCESS, MULTIPROCESS),
    (1, 1, CPU_WORKER, UNIPROCESS, UNIPROCESS),
    (1, 1, CPU_WORKER, MULTIPROCESS, None),
])
def test_the_executor(tensor, pipeline, worker, chosen, backend):
    assert executor_backend(Parallelism(tensor, pipeline), worker, chosen) == backend


def test_the_engine_core_process_runs_one_worker_only():
    with pytest.raises(ValidationError, match="'uni' runs one worker, not 2"):
        AppConfig(models=[{"name": TINY, "pipeline_parallel_size": 2, "distributed_executor_backend": "uni"}])


def test_a_model_in_the_engine_core_process_tells_vllm_s_cpu_platform_so(monkeypatch):
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    compute_in_the_engine_core(ModelConfig(name=TINY))
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
    compute_in_the_engine_core(ModelConfig(name=TINY, distributed_executor_backend=UNIPROCESS))
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_the_ray_executor_needs_gpus():
    with pytest.raises(ValidationError, match="'ray' needs GPUs"):
        AppConfig(models=[{"name": TINY, "tensor_parallel_size": 2, "distributed_executor_backend": "ray"}])


def test_multiprocess_workers_are_held_by_the_replica_in_one_bundle():
    group = placement(Parallelism(8, 1), GPU_WORKER, MULTIPROCESS)
    whole = {"CPU": 32, "GPU": 8, "memory": 8 * (64 << 30), "probserve-model-big": 8}
    assert (group.bundles, group.strategy) == ([whole], "STRICT_PACK")
    assert group.actor_options == {"num_cpus": 32, "num_gpus": 8, "memory": 8 * (64 << 30),
                                   "resources": {"probserve-model-big": 8}}


@pytest.mark.parametrize(("pipeline", "strategy"), [(1, "STRICT_PACK"), (2, "PACK")])
def test_ray_workers_have_a_bundle_each_and_the_replica_sits_in_the_first_without_its_gpu(pipeline, strategy):
    group = placement(Parallelism(8, pipeline), GPU_WORKER, RAY)
    worker = {"CPU": 4, "GPU": 1, "memory": 64 << 30, "probserve-model-big": 1}
    assert group.bundles == [worker] * 8 * pipeline and group.strategy == strategy
    assert group.actor_options == {"num_cpus": 4, "memory": 64 << 30, "resources": {"probserve-model-big": 1}}
    assert group.reserved() == {"num_cpus": 32 * pipeline, "num_gpus": 8 * pipeline,
                                "memory": 8 * pipeline * (64 << 30),
                                "resources": {"probserve-model-big": 8 * pipeline}}


def test_one_worker_needs_no_placement_group():
    assert placement(Parallelism(1, 1), GPU_WORKER, None) is None


def test_a_split_model_is_deployed_in_its_placement_group_and_counted_whole():
    args = {"models": [{"name": TINY, "tensor_parallel_size": 2, "ray_actor_options": CPU_WORKER,
                        "autoscaling_config": {"min_replicas": 1, "max_replicas": 3}}]}
    replica = deployments(args)[model_deployment_name(TINY)]._replica_config
    assert replica.placement_group_bundles == [{"CPU": 1.0}]
    assert replica.placement_group_strategy == "STRICT_PACK"
    assert replica.ray_actor_options["num_cpus"] == 1.0
    assert AppConfig.model_validate(args).placements()[-1] == (
        {"num_cpus": 1.0, "num_gpus": 0, "resources": {}}, {"min_replicas": 1, "max_replicas": 3})


@pytest.mark.parametrize(("cores", "numa_nodes", "workers", "binding"), [
    ([0, 1], 1, 1, None),
    ([0, 1], 1, 2, "0|1"),
    (list(range(16)), 1, 2, "0,1,2,3,4,5,6,7|8,9,10,11,12,13,14,15"),
    ([2, 3, 5, 7, 11], 1, 2, "2,3,5|7,11"),
    (list(range(16)), 2, 2, None),  # vLLM's own: a NUMA node a rank
])
def test_each_cpu_worker_gets_cores_of_its_own(cores, numa_nodes, workers, binding):
    assert cpu_binding(cores, numa_nodes, workers) == binding


def test_more_cpu_workers_than_cores_are_refused():
    with pytest.raises(ValueError, match="4 CPU workers need a core each; this process may use 2"):
        cpu_binding([0, 1], 1, 4)
