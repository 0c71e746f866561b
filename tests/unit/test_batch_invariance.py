"""Where vLLM's batch-invariant mode may run, and the refusal elsewhere: at config load for
replicas without GPUs, at the replica's start for a device without the kernels."""

import pytest
from pydantic import ValidationError

from serve_app.batch_invariance import Device, refusal
from serve_app.config import ModelConfig
from serve_app.store.model_store import TINY


@pytest.mark.parametrize("device", [Device("cuda", "NVIDIA A100-SXM4-80GB", (8, 0)),
                                    Device("cuda", "NVIDIA L4", (8, 9)),
                                    Device("cuda", "NVIDIA H100 80GB HBM3", (9, 0)),
                                    Device("cuda", "NVIDIA B200", (10, 0))])
def test_nvidia_gpus_from_compute_capability_8_run_it(device):
    assert refusal(device) is None


@pytest.mark.parametrize(("device", "named"), [
    (Device("cuda", "Tesla T4", (7, 5)), "Tesla T4, is of compute capability 7.5"),
    (Device("cuda", "Tesla V100-SXM2-16GB", (7, 0)), "compute capability 7.0"),
    (Device("cuda", "an unread GPU", None), "compute capability unknown"),
    (Device("cpu", "cpu"), "computes on cpu:"),
    (Device("rocm", "AMD Instinct MI300X"), "computes on rocm (AMD Instinct MI300X)"),
])
def test_other_devices_are_refused_naming_the_device_and_where_it_runs(device, named):
    reason = refusal(device)
    assert named in reason and "compute capability 8.0 or later" in reason


def test_a_model_without_gpus_is_refused_at_load():
    with pytest.raises(ValidationError, match="'tiny-llama': batch_invariant needs GPU replicas"):
        ModelConfig(name=TINY, batch_invariant=True)
    assert ModelConfig(name=TINY, batch_invariant=True, ray_actor_options={"num_gpus": 1}).batch_invariant
