"""The failures of a call to a model replica that pass: its queue full or waited in too long,
too much work ahead of the call to answer it within the model's bound, its engine or its
replica being replaced. The ingress answers them with a 503 that names a wait; dataset scoring
sends the request again after one."""

import contextlib

from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError

from serve_app.engine.wire import EngineUnavailable, Late, QueueTimeout

TRANSIENT = (BackPressureError, QueueTimeout, Late, EngineUnavailable, RayActorError)


def cancel_call(call) -> None:
    """A Serve handle call cancelled, best effort. With the router in its own loop (Ray Serve's
    default) `cancel()` first fetches which replica took the call, which raises the call's own
    failure again (its queue full): the caller has that failure already, and it must not
    replace the client's answer or stop the other cancellations."""
    with contextlib.suppress(Exception):
        call.cancel()
