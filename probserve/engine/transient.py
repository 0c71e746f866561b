"""The failures of a call to a model replica that pass: its queue full or waited in too long,
its engine or its replica being replaced. The ingress answers them with a 503 that names a
wait; dataset scoring sends the request again after one."""

from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError

from probserve.engine.wire import EngineUnavailable, QueueTimeout

TRANSIENT = (BackPressureError, QueueTimeout, EngineUnavailable, RayActorError)
