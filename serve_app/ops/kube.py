"""The Kubernetes side of a Serve config file: what each k8s/ overlay adds to the base RayService.

A Serve config (deployments/*.yaml) says where each deployment runs through Ray custom
resources: a model asking for `probserve-model-<name>` runs on that model's worker group; the
ingress, the serializer pool and any model without such a resource on the CPU group. From the
file and the base RayService (k8s/base/rayservice.yaml) this module writes each overlay's
`serve.yaml`: a JSON patch that sets serveConfigV2 to the file, adds a worker group per model
(its pod sized from the model's `num_cpus`, `num_gpus` and `memory`) and sizes the CPU group.
`python -m serve_app.ops.kube` writes them; a test fails when the committed ones differ.
"""

import copy
import json
import math
from pathlib import Path

import yaml

from serve_app.config import AppConfig, ModelConfig
from serve_app.parallel import bundles_total, scaled

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "k8s" / "base" / "rayservice.yaml"
# Overlay -> the Serve config file its RayService serves.
OVERLAYS = {"cpu-demo": "deployments/local.yaml", "gpu": "deployments/gpu.yaml",
            "production": "deployments/production.yaml"}
CPU_GROUP_RESOURCE = "probserve-cpu"
MODEL_GROUP_PREFIX = "probserve-model-"
MODELS_MOUNT = "/models"
# The Files and Batch APIs' folder (batch.storage), shared by every CPU pod (k8s/batch-volume).
BATCH_MOUNT = "/var/lib/serve_app/batch"
GIB = 1 << 30
# Per pod, beyond what the replicas ask: Ray's raylet and agents, and the object store (full-
# vocabulary chunks on their way from a model replica to the pool: at most `window` chunks of
# 16 positions x 128k x 4 bytes, 8 MB each, per response).
RAY_OVERHEAD_CPUS = 1
RAY_PROCESSES_MEMORY = 2 * GIB
MODEL_OBJECT_STORE = 2 * GIB
CLUSTER = "/spec/rayClusterConfig"
# The memory volume at /dev/shm that holds a pod's object store (k8s/base/rayservice.yaml).
SHM_VOLUME = "shm"
# /dev/shm beside the object store for each engine worker of a pod that holds several: NCCL's
# buffers between GPUs without a direct path, vLLM's message queues between its processes.
SHM_PER_WORKER = GIB


def serve_config_v2(document: dict) -> str:
    """The Serve config as the RayService carries it; its proxies listen on the pod's address,
    where the Service reaches them."""
    served = copy.deepcopy(document)
    served.setdefault("http_options", {})["host"] = "0.0.0.0"
    return yaml.safe_dump(served, sort_keys=False)


def model_group_resource(options: dict) -> str | None:
    return next((name for name in options.get("resources", {}) if name.startswith(MODEL_GROUP_PREFIX)), None)


class PodSize:
    """A pod's CPUs, and the memory Ray lets its actors ask for: the container's limit less the
    object store and Ray's own processes."""

    def __init__(self, group: dict):
        (container,) = group["template"]["spec"]["containers"]
        self.cpus = float(container["resources"]["requests"]["cpu"])
        limit = container["resources"]["limits"]["memory"]
        if not limit.endswith("Gi"):
            raise ValueError(f"write the pods' memory limits in Gi, not {limit}")
        object_store = int(group["rayStartParams"]["object-store-memory"])
        self.ray_memory = int(limit.removesuffix("Gi")) * GIB - object_store - RAY_PROCESSES_MEMORY


def on_cpu_group(config: AppConfig) -> list[tuple[dict, dict]]:
    """What runs on the CPU group: all but the models that have a group of their own."""
    return [(options, scaling) for options, scaling in config.placements()
            if model_group_resource(options) is None]


def cpu_group_bounds(config: AppConfig, pod: PodSize) -> tuple[int, int]:
    """Pods the CPU group needs, by CPUs and by memory, for the least and the most replicas of
    what it runs."""
    def pods(bound: str) -> int:
        placed = on_cpu_group(config)
        cpus = sum(options.get("num_cpus", 1) * scaling.get(bound, 1) for options, scaling in placed)
        memory = sum(options.get("memory", 0) * scaling.get(bound, 1) for options, scaling in placed)
        return max(1, math.ceil(cpus / pod.cpus), math.ceil(memory / pod.ray_memory))
    return pods("min_replicas"), pods("max_replicas")


def quantity(memory_bytes: int) -> str:
    return f"{math.ceil(memory_bytes / GIB)}Gi"


def model_group(model: ModelConfig, template: dict, resource: str) -> dict:
    """A worker group of the CPU group's pod, sized for the model: a pod a replica, or, for a
    model split across nodes, a pod a node's share of its workers (a pipeline stage)."""
    share = model.workers_per_node()
    options = bundles_total([scaled(model.ray_actor_options, share)])
    pods_a_replica, scaling = model.parallelism().workers // share, model.autoscaling_config
    group = copy.deepcopy(template)
    pod = group["template"]
    pod["metadata"]["labels"].update({"app.kubernetes.io/component": "model",
                                      "probserve.dev/model": model.name})
    (container,) = pod["spec"]["containers"]
    cpus = math.ceil(options.get("num_cpus", 1)) + RAY_OVERHEAD_CPUS
    memory = quantity(options.get("memory", 8 * GIB * share) + MODEL_OBJECT_STORE + RAY_PROCESSES_MEMORY)
    gpus = options["num_gpus"]
    container["resources"] = {"requests": {"cpu": str(cpus), "memory": memory},
                              "limits": {"cpu": str(cpus), "memory": memory}}
    if gpus:
        for bound in container["resources"].values():
            bound["nvidia.com/gpu"] = str(math.ceil(gpus))
    container["readinessProbe"]["httpGet"]["path"] = f"/health?model={model.name}"
    (shm,) = [volume for volume in pod["spec"]["volumes"] if volume["name"] == SHM_VOLUME]
    shm["emptyDir"]["sizeLimit"] = quantity(MODEL_OBJECT_STORE + (SHM_PER_WORKER * share if share > 1 else 0))
    least, most = (scaling.get(bound, 1) * pods_a_replica for bound in ("min_replicas", "max_replicas"))
    group.update(groupName=model.name[:63], minReplicas=least, maxReplicas=most, replicas=least,
                 rayStartParams={**group["rayStartParams"], "num-cpus": str(cpus - RAY_OVERHEAD_CPUS),
                                 "object-store-memory": str(MODEL_OBJECT_STORE),
                                 "resources": json.dumps(json.dumps({resource: share}))})
    return group


def models_volume_ops(groups: list[str]) -> list[dict]:
    """The model weights' volume (a PersistentVolumeClaim, read-only) on the worker pods: the
    model replicas load the weights from it and the ingress the tokenizer."""
    ops = []
    for pod in groups:
        ops.append({"op": "add", "path": f"{pod}/template/spec/volumes/-",
                    "value": {"name": "models", "persistentVolumeClaim": {"claimName": "probserve-models",
                                                                         "readOnly": True}}})
        ops.append({"op": "add", "path": f"{pod}/template/spec/containers/0/volumeMounts/-",
                    "value": {"name": "models", "mountPath": MODELS_MOUNT, "readOnly": True}})
    return ops


def batch_volume_ops(cpu_group: str) -> list[dict]:
    """The batch volume (a ReadWriteMany claim) on the CPU pods, where the ingress replicas and
    the batch runner keep files and batches: one folder, whichever pod each runs on."""
    return [{"op": "add", "path": f"{cpu_group}/template/spec/volumes/-",
             "value": {"name": "batch", "persistentVolumeClaim": {"claimName": "probserve-batch"}}},
            {"op": "add", "path": f"{cpu_group}/template/spec/containers/0/volumeMounts/-",
             "value": {"name": "batch", "mountPath": BATCH_MOUNT}}]


def overlay_patch(document: dict, base: dict) -> list[dict]:
    """The JSON patch (RFC 6902) an overlay applies to the base RayService."""
    config = AppConfig.model_validate(document["applications"][0]["args"])
    cpu_group = base["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    least, most = cpu_group_bounds(config, PodSize(cpu_group))
    ops = [{"op": "add", "path": "/spec/serveConfigV2", "value": serve_config_v2(document)},
           {"op": "replace", "path": f"{CLUSTER}/workerGroupSpecs/0/minReplicas", "value": least},
           {"op": "replace", "path": f"{CLUSTER}/workerGroupSpecs/0/replicas", "value": least},
           {"op": "replace", "path": f"{CLUSTER}/workerGroupSpecs/0/maxReplicas", "value": most}]
    pods = [f"{CLUSTER}/workerGroupSpecs/0"]
    for model in config.models:
        resource = model_group_resource(model.ray_actor_options)
        if resource is not None:
            ops.append({"op": "add", "path": f"{CLUSTER}/workerGroupSpecs/-",
                        "value": model_group(model, cpu_group, resource)})
            pods.append(f"{CLUSTER}/workerGroupSpecs/{len(pods)}")
    if any(model.path and model.path.startswith(MODELS_MOUNT + "/") for model in config.models):
        ops += models_volume_ops(pods)
    if config.batch.storage == BATCH_MOUNT:
        ops += batch_volume_ops(pods[0])
    return ops


class Dumper(yaml.SafeDumper):
    """Multi-line strings (serveConfigV2) as YAML blocks, readable in the manifests."""


Dumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def render(overlay: str) -> str:
    source = OVERLAYS[overlay]
    document = yaml.safe_load((ROOT / source).read_text())
    patch = overlay_patch(document, yaml.safe_load(BASE.read_text()))
    header = (f"# Generated from {source} and k8s/base/rayservice.yaml by `python -m serve_app.ops.kube`:\n"
              "# edit those and run it again (tests/unit/test_kube.py fails while they differ).\n")
    return header + yaml.dump(patch, Dumper=Dumper, sort_keys=False, width=100)


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word.title() for word in rest)


def pod_monitor() -> str:
    """Prometheus Operator's PodMonitor for every pod's metrics port, with the relabelling of
    grafana/prometheus.yml (the names the dashboard and the alerts use)."""
    scrape = yaml.safe_load((ROOT / "grafana" / "prometheus.yml").read_text())["scrape_configs"][0]
    relabelings = [{camel(key): value for key, value in rule.items()}
                   for rule in scrape["metric_relabel_configs"]]
    monitor = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
               "metadata": {"name": "probserve"},
               "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "probserve"}},
                        "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s",
                                                 "metricRelabelings": relabelings}]}}
    return ("# Generated from grafana/prometheus.yml by `python -m serve_app.ops.kube`: Ray's metrics agent\n"
            "# on each pod's port 8080 exports every process's metrics on that node.\n"
            + yaml.safe_dump(monitor, sort_keys=False))


def generated_files() -> dict[Path, str]:
    files = {ROOT / "k8s" / "overlays" / overlay / "serve.yaml": render(overlay) for overlay in OVERLAYS}
    files[ROOT / "k8s" / "base" / "podmonitor.yaml"] = pod_monitor()
    return files


def main() -> None:
    for path, text in generated_files().items():
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
