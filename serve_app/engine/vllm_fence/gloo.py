"""In every process of vLLM's that joins torch.distributed (each worker; the engine core where
the model computes there): the process's gloo groups share one device (item 12 of
serve_app.engine.vllm_fence.touch_points).

torch gives each gloo process group a transport device of its own, and each device a thread that
polls its sockets every 10 ms (gloo's tcp/loop.cc, a timeout compiled in), busy or idle. vLLM
makes about a dozen groups per worker, one or two per kind of parallelism, even for a model of
one worker: 1.3 CPU-seconds a minute of an idle engine, the most of any of its parts. A device
serves any number of groups (gloo's pairs of every group are sockets in its one poll), so the
groups share the devices the first one made: one polling thread instead of thirteen."""

import os
from datetime import timedelta

# torch's default timeout of a gloo group, and the interfaces it binds its devices to where set.
DEFAULT_TIMEOUT = timedelta(minutes=30)
INTERFACES = "GLOO_SOCKET_IFNAME"


def shared_devices(gloo) -> list:
    """The devices torch makes for a new group, as it makes them: one per interface named in
    GLOO_SOCKET_IFNAME, else one for the host's name."""
    interfaces = [name for name in os.environ.get(INTERFACES, "").split(",") if name]
    if interfaces:
        return [gloo.create_device(interface=name) for name in interfaces]
    return [gloo.create_default_device()]


def one_gloo_device_per_process() -> None:
    """Gloo groups made from now on in this process share its devices (item 12)."""
    import torch.distributed.distributed_c10d as c10d

    if not c10d.is_gloo_available() or getattr(c10d.ProcessGroupGloo, "probserve", False):
        return
    gloo = c10d.ProcessGroupGloo

    class SharingDevices(gloo):
        """ProcessGroupGloo as torch and vLLM construct it, (store, rank, size, timeout=...),
        on the process's shared devices, with the threads torch gives a group per device."""

        probserve = True
        devices: list = []

        def __init__(self, store, rank, size, timeout=DEFAULT_TIMEOUT):
            if not SharingDevices.devices:
                SharingDevices.devices = shared_devices(gloo)
            options = gloo._Options()
            options._timeout, options._devices = timeout, SharingDevices.devices
            options._threads = 2 * len(SharingDevices.devices)
            super().__init__(store, rank, size, options)

    c10d.ProcessGroupGloo = SharingDevices
