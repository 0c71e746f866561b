"""The model replica the end-to-end service runs: probserve's own, with what only tests ask of
it (how many engine requests reached it, what its engine holds, its engine's processes), so
none of that lives on the production replica."""

import sys
from collections import Counter

from ray import cloudpickle, serve

from probserve.engine.replica import ModelReplica


class InspectedReplica(ModelReplica.func_or_class):
    async def __init__(self, *args, **kwargs):
        self.requests_received = 0
        self.priorities = Counter()
        await super().__init__(*args, **kwargs)

    async def outputs(self, request, stream: bool):
        self.requests_received += 1
        self.priorities[request.priority] += 1
        async for output in super().outputs(request, stream):
            yield output

    def request_count(self) -> int:
        """Engine requests this replica has received (warm-up and self-checks included): the
        signal that refused requests never get here."""
        return self.requests_received

    def requests_by_priority(self) -> dict[int, int]:
        """Engine requests received at each scheduling priority."""
        return dict(self.priorities)

    def unfinished_requests(self) -> int:
        """Requests the engine holds (running or waiting): a client that leaves must not
        stay among them."""
        return self.engine.output_processor.get_num_unfinished_requests()

    def engine_core_pids(self) -> list[int]:
        """The engine's EngineCore processes, as vLLM's own launcher holds them (a process's
        title is no sure sign: one fresh-clone run found none titled EngineCore)."""
        return [process.pid for process in self.engine.engine_core.resources.engine_manager.processes]


# Ray's workers cannot import the tests package: the class travels by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
INSPECTED_REPLICA = serve.deployment(InspectedReplica)
