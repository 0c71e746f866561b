"""Online requests first: when background work (batch lines, dataset documents) may enter a
model replica's engine.

vLLM's priority scheduling takes the online requests it holds waiting before the background
ones, and preempts background ones first when its KV cache runs short; but it schedules the
requests it has started first, each step, and a step runs to its end. So an online request
that arrives finds the engine's current step, and the background prefills already in it,
ahead of it. The replica therefore hands its engine background work only while no online
request is in it, at most `in_engine` requests at a time, and a background prompt a short
window at a time (serve_app.engine.windows): an online request waits for one window at most,
and background work takes the engine's time that online requests leave.

Windows cost throughput (a short prefill uses the engine less well, and each is a request of
its own: half the tokens per second of whole prompts on 2 cores), and they only help while
online requests come. So once no online request has been in the engine for `quiet_s`, the
rest of a background prompt goes in whole, and `in_engine_quiet` of them may be in at once
(a handful keeps the engine busy while the replica hands over the next); the first online
request after such a pause may wait for their prefills.
"""

import asyncio
import time
from contextlib import asynccontextmanager

from serve_app.engine.wire import EngineRequest


class BackgroundShare:
    def __init__(self, in_engine: int, in_engine_quiet: int, quiet_s: float, clock=time.monotonic):
        self.in_engine, self.in_engine_quiet = in_engine, in_engine_quiet
        self.quiet_s, self.clock = quiet_s, clock
        self.online = 0  # online requests in the engine
        self.online_seen_at = -float("inf")  # when the last one left it
        self.background = 0  # background requests in the engine
        self.waiting = 0  # background requests held in the replica for their turn
        self.room = asyncio.Event()
        self.room.set()

    @asynccontextmanager
    async def turn(self, request: EngineRequest):
        """One engine request's time in the engine: an online one goes in at once, a
        background one when no online request is in and one of the places is free (more
        places once online requests have paused: a background request that waits for one
        sees them when the next one leaves)."""
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
                self.online_seen_at = self.clock()
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

    def quiet(self) -> bool:
        """No online request in the engine, nor in it for `quiet_s`: background prompts go whole."""
        return self.online == 0 and self.clock() - self.online_seen_at >= self.quiet_s

    def admits_background(self) -> bool:
        places = self.in_engine_quiet if self.quiet() else self.in_engine
        return self.online == 0 and self.background < places

    def update_room(self) -> None:
        if self.admits_background():
            self.room.set()
        else:
            self.room.clear()
