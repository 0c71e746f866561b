"""Online requests first: when background work (batch lines, dataset documents) may enter a
model replica's engine.

vLLM's priority scheduling takes the online requests it holds waiting before the background
ones, and preempts background ones first when its KV cache runs short; but it schedules the
requests it has started first, each step, and a step runs to its end. So an online request
that arrives finds the engine's current step, and the background prefills already in it,
ahead of it. The replica therefore hands its engine background work only while no online
request is in it, at most `in_engine` requests at a time, and a background prompt a short
window at a time (probserve.engine.windows): an online request waits for one window at most,
and background work takes the engine's time that online requests leave.
"""

import asyncio
from contextlib import asynccontextmanager

from probserve.engine.wire import EngineRequest


class BackgroundShare:
    def __init__(self, in_engine: int):
        self.in_engine = in_engine
        self.online = 0  # online requests in the engine
        self.background = 0  # background requests in the engine
        self.waiting = 0  # background requests held in the replica for their turn
        self.room = asyncio.Event()
        self.room.set()

    @asynccontextmanager
    async def turn(self, request: EngineRequest):
        """One engine request's time in the engine: an online one goes in at once, a
        background one when no online request is in and one of the places is free."""
        if request.background():
            await self.background_place()
        else:
            self.online += 1
            self.update_room()
        try:
            yield
        finally:
            if request.background():
                self.background -= 1
            else:
                self.online -= 1
            self.update_room()

    async def background_place(self) -> None:
        self.waiting += 1
        try:
            while not self.admits_background():
                await self.room.wait()
        finally:
            self.waiting -= 1
        self.background += 1
        self.update_room()

    def admits_background(self) -> bool:
        return self.online == 0 and self.background < self.in_engine

    def update_room(self) -> None:
        if self.admits_background():
            self.room.set()
        else:
            self.room.clear()
