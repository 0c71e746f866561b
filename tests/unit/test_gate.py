"""The one bounded-wait primitive behind tenants' queues and full-vocabulary slots."""

import asyncio

import pytest

from serve_app.gate import Gate, once


class Refused(Exception):
    pass


def refuse(gate: Gate) -> Exception:
    return Refused(f"{gate.bound} busy, {gate.waiting} waiting")


def test_holders_beyond_the_bound_wait_and_enter_in_turn():
    changes = []

    async def run():
        gate = Gate(1, changes.append)
        release = await gate.enter(max_waiting=1, wait_s=5, refusal=refuse)
        waiter = asyncio.create_task(gate.enter(max_waiting=1, wait_s=5, refusal=refuse))
        await asyncio.sleep(0)
        assert gate.waiting == 1 and not waiter.done()
        release()
        (await waiter)()
        assert gate.held == 0
    asyncio.run(run())
    assert changes == [1, -1]  # the first entered at once, without waiting


def test_too_many_waiting_is_refused_at_once_and_a_long_wait_in_the_end():
    async def run():
        gate = Gate(1)
        await gate.enter(max_waiting=1, wait_s=0.05, refusal=refuse)
        with pytest.raises(Refused, match="1 busy, 0 waiting"):  # timed out while waiting
            await gate.enter(max_waiting=1, wait_s=0.05, refusal=refuse)
        waiter = asyncio.create_task(gate.enter(max_waiting=1, wait_s=5, refusal=refuse))
        await asyncio.sleep(0)
        with pytest.raises(Refused, match="1 busy, 1 waiting"):
            await asyncio.wait_for(gate.enter(max_waiting=1, wait_s=5, refusal=refuse), 1)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert gate.waiting == 0  # a waiter that gave up is no longer counted
    asyncio.run(run())


def test_a_burst_arriving_at_once_gets_exactly_the_places_and_waiting_room():
    async def run():
        gate = Gate(2)
        entries = await asyncio.gather(*(gate.enter(max_waiting=3, wait_s=0.2, refusal=refuse)
                                         for _ in range(8)), return_exceptions=True)
        refused = [entry for entry in entries if isinstance(entry, Refused)]
        assert len(refused) == 6  # 2 entered, 3 waited out their 0.2 s, 3 refused at once
        assert sum("waiting" in str(r) and "3 waiting" in str(r) for r in refused) == 3
    asyncio.run(run())


def test_a_waiter_given_a_place_no_longer_counts_as_waiting():
    async def run():
        gate = Gate(1)
        release = await gate.enter(max_waiting=1, wait_s=5, refusal=refuse)
        first = asyncio.create_task(gate.enter(max_waiting=1, wait_s=5, refusal=refuse))
        await asyncio.sleep(0)
        release()  # the place is the first waiter's now, before it runs again
        second = asyncio.create_task(gate.enter(max_waiting=1, wait_s=5, refusal=refuse))
        await asyncio.sleep(0)
        assert gate.waiting == 1 and not second.done()
        (await first)()
        (await second)()
    asyncio.run(run())


def test_a_release_frees_one_place_however_often_it_is_called():
    calls = []
    release = once(lambda: calls.append(1))
    release()
    release()
    assert calls == [1]
