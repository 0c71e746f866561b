import asyncio

from serve_app.engine.background import BackgroundShare
from serve_app.engine.wire import EngineRequest

REQUEST = {"prompt_token_ids": [1, 2], "max_tokens": 1, "temperature": 0.0, "top_p": 1.0, "tenant": "t"}
ONLINE, BATCH = EngineRequest(**REQUEST, priority=0), EngineRequest(**REQUEST, priority=1)
QUIET_S, QUIET_PLACES = 2.0, 8


async def online_just_now(in_engine: int) -> BackgroundShare:
    """A share whose clock stands still just after an online request left: never quiet."""
    share = BackgroundShare(in_engine, QUIET_PLACES, QUIET_S, clock=lambda: 0.0)
    async with share.turn(ONLINE):
        pass
    return share


def test_background_requests_take_the_places_and_online_ones_pass_them():
    async def scenario():
        share, release = await online_just_now(2), asyncio.Event()
        inside: list[str] = []

        async def enter(name: str, request: EngineRequest):
            async with share.turn(request):
                inside.append(name)
                await release.wait()
        tasks = [asyncio.create_task(enter(f"batch-{i}", BATCH)) for i in range(4)]
        await asyncio.sleep(0.01)
        tasks.append(asyncio.create_task(enter("online", ONLINE)))
        await asyncio.sleep(0.01)
        held = (sorted(inside), share.waiting)
        release.set()
        await asyncio.gather(*tasks)
        return held, sorted(inside), share.waiting
    held, everyone, waiting = asyncio.run(scenario())
    assert held == (["batch-0", "batch-1", "online"], 2)
    assert everyone == ["batch-0", "batch-1", "batch-2", "batch-3", "online"] and waiting == 0


def test_background_requests_wait_while_an_online_one_is_in_the_engine():
    async def scenario():
        share, online_done = await online_just_now(4), asyncio.Event()
        order: list[str] = []

        async def online():
            async with share.turn(ONLINE):
                order.append("online in")
                await online_done.wait()
                order.append("online out")

        async def batch(name: str):
            async with share.turn(BATCH):
                order.append(name)
        first = asyncio.create_task(online())
        await asyncio.sleep(0.01)
        batches = [asyncio.create_task(batch(f"batch-{i}")) for i in range(2)]
        await asyncio.sleep(0.01)
        held = (list(order), share.waiting)
        online_done.set()
        await asyncio.gather(first, *batches)
        return held, order
    held, order = asyncio.run(scenario())
    assert held == (["online in"], 2)
    assert order == ["online in", "online out", "batch-0", "batch-1"]


def test_a_place_is_given_back_when_its_request_fails_or_is_cancelled():
    async def scenario():
        share = await online_just_now(1)
        try:
            async with share.turn(BATCH):
                raise RuntimeError("the engine stopped")
        except RuntimeError:
            pass
        holder = asyncio.create_task(hold(share))
        await asyncio.sleep(0.01)
        waiter = asyncio.create_task(hold(share))
        await asyncio.sleep(0.01)
        waiter.cancel()  # a client gone while its request waited for a place
        holder.cancel()
        await asyncio.gather(holder, waiter, return_exceptions=True)
        async with share.turn(BATCH):
            return share.waiting
    assert asyncio.run(scenario()) == 0


async def hold(share: BackgroundShare):
    async with share.turn(BATCH):
        await asyncio.sleep(10)


def test_background_prompts_go_whole_and_take_more_places_once_online_requests_have_paused():
    async def scenario():
        now = [100.0]
        share = BackgroundShare(1, QUIET_PLACES, QUIET_S, clock=lambda: now[0])
        seen = [share.quiet()]  # none came yet
        async with share.turn(ONLINE):
            now[0] += 10
            seen.append(share.quiet())  # one is in the engine
        now[0] += QUIET_S / 2
        seen.append(share.quiet())
        held = [asyncio.create_task(hold(share)) for _ in range(QUIET_PLACES + 1)]
        await asyncio.sleep(0.01)
        places = (share.background, share.waiting)  # one place while online requests are recent
        now[0] += QUIET_S / 2
        seen.append(share.quiet())
        held[0].cancel()  # the next to leave lets the others see the pause
        await asyncio.sleep(0.01)
        places += (share.background, share.waiting)
        for task in held:
            task.cancel()
        await asyncio.gather(*held, return_exceptions=True)
        return seen, places
    seen, places = asyncio.run(scenario())
    assert seen == [True, False, False, True]
    assert places == (1, QUIET_PLACES, QUIET_PLACES, 0)
