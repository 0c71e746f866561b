"""Online requests first: how much background work (batch lines, dataset documents) a model
replica lets into its engine.

vLLM's priority scheduling takes the online requests it holds waiting before the background
ones, and preempts background ones first when its KV cache runs short; but a request it has
started runs its prefill to the end, one step after another, before any waiting one. So the
replica hands its engine a bounded number of background requests at a time: an online
request finds at most those ahead of it, whatever the size of the batch behind them.
"""

import asyncio
from contextlib import asynccontextmanager

from probserve.engine.wire import EngineRequest


class BackgroundShare:
    def __init__(self, in_engine: int):
        self.places = asyncio.Semaphore(in_engine)
        self.waiting = 0  # background requests held in the replica for a place

    @asynccontextmanager
    async def turn(self, request: EngineRequest):
        """Online requests go on at once; a background one waits for one of the places."""
        if not request.background():
            yield
            return
        self.waiting += 1
        try:
            await self.places.acquire()
        finally:
            self.waiting -= 1
        try:
            yield
        finally:
            self.places.release()
