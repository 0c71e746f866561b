"""Which models have a running replica, as the Serve controller last said.

Ray Serve holds a request for a deployment with no running replica until one starts, however
long that takes: after a node is lost, until a new one joins. A model that should always have
one (min_replicas >= 1) and has none is refused at once with 503 `not_ready` instead. A model
that scales to zero keeps Serve's behaviour: its requests wait for the replica they wake.
"""

import asyncio
import logging
import time
from collections.abc import Callable

from ray.serve.context import _get_global_client

logger = logging.getLogger("probserve.availability")


# A restarted Serve controller reports the replicas it finds as RECOVERING until it has asked
# each: they serve all along (tests/e2e/test_chaos.py).
SERVING_STATES = ("RUNNING", "RECOVERING")


def serve_details() -> dict:
    """The Serve controller's details of its applications, as `serve.status()` asks for them,
    without the models it builds of them: those pickle each deployment's request router class
    again, which in a process that has imported this much is most of the call's CPU
    (docs/benchmarks.md#shipped-settings-measured)."""
    return _get_global_client().get_serve_details()


def running_replicas(details: dict, app_name: str) -> dict[str, int]:
    """Serving replicas per deployment of the application, from the Serve controller's details
    of its applications (the dict `serve.status()` is made from: each replica with its state)."""
    application = details.get("applications", {}).get(app_name)
    if application is None:
        return {}
    return {name: sum(replica["state"] in SERVING_STATES for replica in deployment.get("replicas", []))
            for name, deployment in application["deployments"].items()}


class ReplicaStates:
    """Running replica counts, refreshed in the background while requests ask for them: a
    request reads the last known counts and never waits for the controller."""

    def __init__(self, fetch: Callable[[], dict[str, int]], max_age_s: float = 1.0):
        self.fetch, self.max_age_s = fetch, max_age_s
        self.counts: dict[str, int] = {}
        self.fetched_at = float("-inf")
        self.refreshing: asyncio.Task | None = None

    def running(self, deployment: str) -> int | None:
        """The last known count (None before the first answer); starts a refresh when stale."""
        if time.monotonic() - self.fetched_at > self.max_age_s and self.refreshing is None:
            self.refreshing = asyncio.get_running_loop().create_task(self.refresh())
        return self.counts.get(deployment)

    async def known(self, deployment: str) -> int | None:
        """The count as of at most `max_age_s` ago, asked of the controller when older:
        readiness must not answer from a stale count (a replica that started since), nor take
        an unknown count for a running replica."""
        self.running(deployment)  # starts a refresh when the counts are stale
        if self.refreshing is not None:
            await asyncio.shield(self.refreshing)
        return self.counts.get(deployment)

    async def refresh(self) -> None:
        try:
            self.counts = await asyncio.to_thread(self.fetch)
            self.fetched_at = time.monotonic()
        except Exception as error:  # the controller restarting: keep the last counts
            logger.warning("replica states unavailable: %s", error)
        finally:
            self.refreshing = None
