"""The LoRA adapters a replica's engine holds: each loaded on its first request, numbered for
vLLM (a number never reused for another), at most `lora.max_cpu_loras` at once, the least
recently used removed first.

Ray Serve's model multiplexing holds them (`serve.multiplexed`): it keeps the least-recently-
used order and tells every router which adapters each replica holds, so that a request for an
adapter goes preferably to a replica that has it (Serve's router, given the request's
`multiplexed_model_id`: the adapter's key). Removing the one it drops from the engine too keeps
what the routers are told true (vLLM would drop one of its own choosing).
"""

import functools
import logging

from ray import serve

from serve_app.engine.vllm_adapter import lora_request
from serve_app.engine.wire import Adapter, AdapterUnavailable

logger = logging.getLogger("probserve.replica")


class HeldAdapter:
    """An adapter in the engine as Serve's multiplexer holds it. The multiplexer calls an
    object's `__del__` when it drops it: set on the instance, so that garbage collection
    (which reads the class's) never does."""

    def __init__(self, request, remove):
        self.request = request
        self.__del__ = remove


class EngineAdapters:
    def __init__(self, engine, model_name: str, capacity: int):
        self.engine, self.model_name = engine, model_name
        self.numbers: dict[Adapter, int] = {}
        self.by_key: dict[str, Adapter] = {}

        async def hold(key: str) -> HeldAdapter:
            return await self.load(self.by_key[key])
        # A function of its own: the multiplexer keeps its state on the function it wraps.
        self.held = serve.multiplexed(max_num_models_per_replica=capacity)(hold)

    async def request(self, adapter: Adapter | None):
        """vLLM's request for the adapter, loaded into the engine if it is not there."""
        if adapter is None:
            return None
        self.by_key[adapter.key] = adapter
        return (await self.held(adapter.key)).request

    def number(self, adapter: Adapter) -> int:
        """The adapter's number in this engine, given in the order first seen."""
        if adapter not in self.numbers:
            self.numbers[adapter] = max(self.numbers.values(), default=0) + 1
        return self.numbers[adapter]

    async def load(self, adapter: Adapter) -> HeldAdapter:
        """Loaded here rather than in an engine step, where an adapter vLLM cannot load would
        stop the engine: AdapterUnavailable instead."""
        request = lora_request(adapter, self.number(adapter))
        try:
            await self.engine.add_lora(request)
        except Exception as error:
            # vLLM's reason names the folder, which only the log may show.
            logger.error("model %s: adapter %s not loaded: %s", self.model_name, adapter.name, error)
            raise AdapterUnavailable(f"model {self.model_name!r} could not load adapter "
                                     f"{adapter.name!r}: its folder is missing on this replica's "
                                     "node or holds no readable LoRA adapter") from None
        return HeldAdapter(request, functools.partial(self.remove, adapter))

    async def remove(self, adapter: Adapter) -> None:
        await self.engine.remove_lora(self.numbers[adapter])
        del self.by_key[adapter.key]
