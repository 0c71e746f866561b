"""vLLM's batch-invariant mode: a request's numbers the same bits whatever else shares its
engine steps, on GPUs whose kernels vLLM makes so; a clear refusal, naming why, elsewhere
(docs/api.md "Determinism"). Pure logic: the config refuses it for replicas without GPUs,
serve_app.engine.vllm_adapter reads the replica's device and turns the mode on before vLLM
loads."""

from dataclasses import dataclass

# vLLM reads it in every process of the engine (and hands it to Ray workers with its own).
SWITCH = "VLLM_BATCH_INVARIANT"
# vLLM 0.32 (vllm/model_executor/determinism/batch_invariant.py, docs/features/batch_invariance.md):
# Triton matmuls of a fixed reduction order on compute capability 8.x, cuBLAS without split-k
# from 9.0 (Hopper, Blackwell); none below 8.0. (Its AMD Instinct kernels need a ROCm build,
# which probserve does not ship.)
LEAST_CAPABILITY = (8, 0)
WHERE = (f"vLLM's batch-invariant kernels run on NVIDIA GPUs of compute capability "
         f"{LEAST_CAPABILITY[0]}.{LEAST_CAPABILITY[1]} or later (A100, L4, L40S, H100, H200, B200)")


@dataclass(frozen=True)
class Device:
    """What a replica computes on: vLLM's platform (`cuda`, `cpu`, ...), the device's name, and
    an NVIDIA GPU's compute capability."""

    platform: str
    name: str
    capability: tuple[int, int] | None = None


def refusal(device: Device) -> str | None:
    """Why the mode cannot run on `device`; None where it can."""
    if device.platform != "cuda":
        named = "" if device.name == device.platform else f" ({device.name})"
        return f"the replica computes on {device.platform}{named}: {WHERE}"
    if device.capability is None or device.capability < LEAST_CAPABILITY:
        shown = "unknown" if device.capability is None else ".".join(map(str, device.capability))
        return f"the replica's GPU, {device.name}, is of compute capability {shown}: {WHERE}"
    return None
