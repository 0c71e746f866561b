"""A model replica whose engine spans several workers (tensor and pipeline parallel): the
layout checked against the model's own config, the executor that runs the workers, the
placement group that reserves them, and the cores each CPU worker computes on. Pure logic:
serve_app.ops.app and serve_app.engine.vllm_adapter apply it (docs/operations.md "Models
larger than one GPU")."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# vLLM's executors: its worker processes beside the replica (one node), or Ray actors placed
# in the replica's placement group, on as many nodes as its bundles span; or one worker inside
# vLLM's engine-core process.
MULTIPROCESS, RAY, UNIPROCESS = "mp", "ray", "uni"
# vLLM's CPU workers' cores, rank by rank: "0-7|8-15".
CPU_BINDING = "VLLM_CPU_OMP_THREADS_BIND"


@dataclass(frozen=True)
class Parallelism:
    tensor: int = 1
    pipeline: int = 1

    @property
    def workers(self) -> int:
        return self.tensor * self.pipeline

    def problems(self, hf_config: dict[str, Any]) -> list[str]:
        """Why this layout does not fit a model (its Hugging Face config.json), as vLLM would
        find out in a worker: the attention heads split across tensor ranks (KV heads split
        too, or each replicated on a whole number of ranks), the layers across stages."""
        text = hf_config.get("text_config", hf_config)
        heads = text.get("num_attention_heads")
        kv_heads = text.get("num_key_value_heads") or heads
        layers = text.get("num_hidden_layers")
        problems = []
        if heads is not None and heads % self.tensor:
            problems.append(f"its {heads} attention heads do not divide by tensor_parallel_size "
                            f"{self.tensor}")
        if kv_heads is not None and kv_heads % self.tensor and self.tensor % kv_heads:
            problems.append(f"its {kv_heads} KV heads neither divide by tensor_parallel_size "
                            f"{self.tensor} nor divide it")
        if layers is not None and layers % self.pipeline:
            problems.append(f"its {layers} layers do not divide by pipeline_parallel_size "
                            f"{self.pipeline} (uneven stages: the largest sets the pace)")
        return problems

    def workers_per_node(self, backend: str | None) -> int:
        """The workers one node holds: all of them under the multiprocess executor, a stage's
        tensor ranks (exchanging activations every layer) under the Ray executor."""
        return self.tensor if backend == RAY else self.workers

    def check_model_folder(self, name: str, folder: Path) -> None:
        """ValueError naming the model and the numbers when the layout does not fit it."""
        if self.workers == 1:
            return
        config = folder / "config.json"
        if not config.is_file():
            raise ValueError(f"model {name!r}: no config.json in {folder} to check "
                             f"tensor_parallel_size {self.tensor} x pipeline_parallel_size "
                             f"{self.pipeline} against")
        problems = self.problems(json.loads(config.read_text()))
        if problems:
            raise ValueError(f"model {name!r} cannot be split {self.tensor} x {self.pipeline} "
                             f"(tensor x pipeline): {'; '.join(problems)}")


def uses_gpus(worker_options: dict[str, Any]) -> bool:
    return worker_options.get("num_gpus", 0) > 0


def executor_backend(parallelism: Parallelism, worker_options: dict[str, Any],
                     chosen: str | None) -> str | None:
    """vLLM's executor for the replica's workers: for one worker, `uni` if chosen, else none
    (vLLM's default: a worker process of its own on CPUs); the one `chosen` if any; else the
    multiprocess executor, whose workers are the replica's own processes on its node, for
    tensor parallelism and on CPUs (vLLM's CPU platform has no Ray executor), and the Ray
    executor for pipeline stages on GPUs, which may spill to other nodes."""
    if parallelism.workers == 1:
        return UNIPROCESS if chosen == UNIPROCESS else None
    if chosen is not None:
        return chosen
    spans_nodes = parallelism.pipeline > 1 and uses_gpus(worker_options)
    return RAY if spans_nodes else MULTIPROCESS


def check_backend(backend: str | None, parallelism: Parallelism, worker_options: dict[str, Any]) -> None:
    if backend == UNIPROCESS and parallelism.workers > 1:
        raise ValueError(f"distributed_executor_backend 'uni' runs one worker, not {parallelism.workers} "
                         "(tensor_parallel_size x pipeline_parallel_size): use 'mp' or 'ray'")
    if backend == RAY and not uses_gpus(worker_options):
        raise ValueError("distributed_executor_backend 'ray' needs GPUs (ray_actor_options.num_gpus): "
                         "vLLM's CPU platform runs its workers with the multiprocess executor only")


def scaled(options: dict[str, Any], times: int) -> dict[str, Any]:
    """One worker's Ray resources, `times` over, as a placement group bundle."""
    bundle = {"CPU": options.get("num_cpus", 1) * times}
    if uses_gpus(options):
        bundle["GPU"] = options["num_gpus"] * times
    if options.get("memory"):
        bundle["memory"] = options["memory"] * times
    bundle.update({name: amount * times for name, amount in options.get("resources", {}).items()})
    return bundle


def bundles_total(bundles: list[dict[str, float]]) -> dict[str, Any]:
    """What bundles reserve together, as ray_actor_options: what a node or cluster must hold."""
    total: dict[str, float] = {}
    for bundle in bundles:
        for name, amount in bundle.items():
            total[name] = total.get(name, 0) + amount
    options = {"num_cpus": total.pop("CPU"), "num_gpus": total.pop("GPU", 0)}
    if "memory" in total:
        options["memory"] = total.pop("memory")
    return {**options, "resources": total}


@dataclass(frozen=True)
class Placement:
    """Serve's options for a replica of several workers: its placement group's bundles and
    strategy, and the replica actor's own options (it sits in the first bundle)."""

    bundles: list[dict[str, float]]
    strategy: str
    actor_options: dict[str, Any]

    def serve_options(self) -> dict[str, Any]:
        return {"placement_group_bundles": self.bundles, "placement_group_strategy": self.strategy,
                "ray_actor_options": self.actor_options}

    def reserved(self) -> dict[str, Any]:
        return bundles_total(self.bundles)


def placement(parallelism: Parallelism, worker_options: dict[str, Any],
              backend: str | None) -> Placement | None:
    """The placement group of one replica, given one worker's ray_actor_options; None for one
    worker (the replica's actor options are the worker's).

    Multiprocess executor: the workers are the replica's processes, so the replica's actor
    holds every worker's devices and CPUs (Ray shows an actor only the GPUs it holds) in one
    bundle. Ray executor: a bundle per worker, rank r in bundle r; the replica's actor in the
    first, holding its CPUs, memory and node-group resources but not its GPU, which vLLM's
    rank-0 worker takes. Tensor ranks exchange activations every layer: STRICT_PACK keeps them
    on one node; pipeline stages exchange once per stage, so PACK lets them spill to other
    nodes."""
    if parallelism.workers == 1:
        return None
    if backend == MULTIPROCESS:
        whole = [scaled(worker_options, parallelism.workers)]
        return Placement(whole, "STRICT_PACK", {**worker_options, **bundles_total(whole)})
    strategy = "STRICT_PACK" if parallelism.pipeline == 1 else "PACK"
    actor = {key: value for key, value in worker_options.items() if key != "num_gpus"}
    return Placement([scaled(worker_options, 1) for _ in range(parallelism.workers)], strategy, actor)


def cpu_binding(cores: list[int], numa_nodes: int, workers: int) -> str | None:
    """VLLM_CPU_OMP_THREADS_BIND for CPU workers: None keeps vLLM's own ("auto": rank r on NUMA
    node r), which needs a node per worker; with fewer, the replica's cores in `workers`
    contiguous groups, "0-7|8-15" (vLLM refuses to start otherwise)."""
    if workers == 1 or numa_nodes >= workers:
        return None
    if len(cores) < workers:
        raise ValueError(f"{workers} CPU workers need a core each; this process may use {len(cores)}")
    share, extra = divmod(len(cores), workers)
    groups, start = [], 0
    for rank in range(workers):
        size = share + (rank < extra)
        groups.append(",".join(map(str, cores[start:start + size])))
        start += size
    return "|".join(groups)
