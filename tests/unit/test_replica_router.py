"""The models' request router: a request that finds every replica full waits in a PlaceLine,
woken in order when a request of the router ends, and finds the freed place without asking
the replicas again; Serve's backoff remains only as the longest wait before looking again."""

import asyncio
import random

import pytest
from ray.serve._private.common import DeploymentHandleSource, DeploymentID, ReplicaID, RequestMetadata
from ray.serve._private.request_router.common import PendingRequest

from serve_app.front.replica_router import BoundedStreamRouter, PlaceLine
from tests.unit.fakes import in_a_loop

DEPLOYMENT = DeploymentID(name="Model-m", app_name="probserve")
# The backoff in these tests: a request left to it would outlast HANG_S, so a wake
# that goes missing fails the test instead of passing slowly.
UNWOKEN_S = 600
HANG_S = 10


class FakeReplica:
    """A replica as the router sees it: its places, and its queue length when asked."""

    def __init__(self, name: str, places: int = 1):
        self.replica_id = ReplicaID(unique_id=name, deployment_id=DEPLOYMENT)
        self.max_ongoing_requests = places
        self.node_id, self.availability_zone, self.multiplexed_model_ids = "node", None, set()
        self.ongoing = self.asked = 0

    async def get_queue_len(self, *, deadline_s: float) -> int:
        self.asked += 1
        return self.ongoing


def pending(name: str) -> PendingRequest:
    metadata = RequestMetadata(request_id=name, internal_request_id=name)
    return PendingRequest(args=[], kwargs={}, metadata=metadata)


async def router_of(*replicas: FakeReplica, backoff_s: float = UNWOKEN_S) -> BoundedStreamRouter:
    router = BoundedStreamRouter(deployment_id=DEPLOYMENT, handle_source=DeploymentHandleSource.UNKNOWN,
                                 use_replica_queue_len_cache=True, initial_backoff_s=backoff_s,
                                 max_backoff_s=backoff_s)
    router.initialize_state(stream_items_ahead=2)
    router.update_replicas(list(replicas))
    for replica in replicas:
        router.on_new_queue_len_info(replica.replica_id, replica.ongoing)
    return router


async def asleep(router: BoundedStreamRouter, waiters: int) -> None:
    """Returns once `waiters` routing tasks sleep in the router's line."""
    async with asyncio.timeout(HANG_S):
        while len(router.place_line.turns) != waiters:
            await asyncio.sleep(0.01)


async def sent(router: BoundedStreamRouter, request: PendingRequest) -> FakeReplica:
    """Routed, then sent as Serve's router sends: counted in the cache once it has its replica."""
    replica = await router._choose_replica_for_request(request)
    replica.ongoing += 1
    router.on_send_request(replica.replica_id)
    return replica


def place(router: BoundedStreamRouter, request: PendingRequest) -> asyncio.Task:
    return asyncio.create_task(sent(router, request))


def end_a_request(router: BoundedStreamRouter, replica: FakeReplica) -> None:
    replica.ongoing -= 1
    router.decrement_queue_len_cache(replica.replica_id)


@in_a_loop
async def test_a_waiting_request_takes_the_place_a_request_of_the_router_frees_without_asking():
    replica = FakeReplica("r1")
    replica.ongoing = 1
    router = await router_of(replica)
    waiting = place(router, pending("a"))
    await asleep(router, 1)
    asked = replica.asked
    end_a_request(router, replica)
    assert await asyncio.wait_for(waiting, HANG_S) is replica
    assert replica.asked == asked  # the queue-length cache had the freed place


@in_a_loop
async def test_waiting_requests_are_placed_in_the_order_they_came_one_a_freed_place():
    replica = FakeReplica("r1")
    replica.ongoing = 1
    router = await router_of(replica)
    tasks = []
    for name in "abc":
        tasks.append(place(router, pending(name)))
        await asyncio.sleep(0.01)
    await asleep(router, 2)  # Serve routes with at most two tasks per replica
    for placed in range(3):
        end_a_request(router, replica)
        await asyncio.wait_for(asyncio.shield(tasks[placed]), HANG_S)
        await asleep(router, 2 - placed)
        assert [task.done() for task in tasks] == [i <= placed for i in range(3)]
    assert replica.ongoing == 1


@in_a_loop
async def test_a_replica_full_by_the_cache_is_not_asked_until_a_wait_ends_unwoken():
    replica = FakeReplica("r1")
    replica.ongoing = 1
    router = await router_of(replica)
    await asyncio.sleep(0.01)  # the router asks a new replica once
    asked = replica.asked
    waiting = place(router, pending("a"))
    await asleep(router, 1)
    assert replica.asked == asked
    waiting.cancel()


@in_a_loop
async def test_a_place_freed_by_another_caller_is_found_when_a_wait_ends_unwoken():
    replica = FakeReplica("r1")
    replica.ongoing = 1
    router = await router_of(replica, backoff_s=0.05)
    waiting = place(router, pending("a"))
    await asleep(router, 1)
    replica.ongoing = 0  # another ingress replica's request ended: this router sees no end
    assert await asyncio.wait_for(waiting, HANG_S) is replica
    assert replica.asked >= 1


@in_a_loop
async def test_new_replicas_wake_every_waiter():
    full = FakeReplica("r1")
    full.ongoing = 1
    router = await router_of(full)
    waiting = [place(router, pending(name)) for name in "ab"]
    await asleep(router, 2)
    roomy = FakeReplica("r2", places=2)
    router.update_replicas([full, roomy])
    assert await asyncio.wait_for(asyncio.gather(*waiting), HANG_S) == [roomy, roomy]


@in_a_loop
async def test_when_both_random_choices_are_full_the_replica_with_room_is_chosen():
    replicas = [FakeReplica(name) for name in ("r1", "r2", "r3")]
    replicas[0].ongoing = replicas[1].ongoing = 1
    router = await router_of(*replicas)
    random.seed(0)
    for _ in range(30):  # Serve's own choice would pick r1 and r2 in a third of these
        [chosen] = await router.choose_replicas(router._replicas_list, pending("a"))
        assert replicas[2] in chosen


@in_a_loop
async def test_with_every_replica_full_the_choice_is_serves():
    replicas = [FakeReplica(name) for name in ("r1", "r2", "r3")]
    for replica in replicas:
        replica.ongoing = 1
    router = await router_of(*replicas)
    for _ in range(10):
        [chosen] = await router.choose_replicas(router._replicas_list, pending("a"))
        assert len(chosen) == 2 and len(set(chosen)) == 2


@in_a_loop
async def test_a_line_wakes_its_waiters_first_come_first_woken():
    line = PlaceLine()
    waiters = []
    for _ in range(3):
        waiters.append(asyncio.create_task(line.wait(UNWOKEN_S)))
        await asyncio.sleep(0)
    for woken in range(3):
        line.wake_first()
        await asyncio.sleep(0.01)
        assert [waiter.done() for waiter in waiters] == [i <= woken for i in range(3)]
    assert [waiter.result() for waiter in waiters] == [True, True, True]
    assert not line.turns


@in_a_loop
async def test_a_waiter_that_is_not_woken_looks_again_and_leaves_no_turn_behind():
    line = PlaceLine()
    assert await line.wait(0.01) is False
    assert not line.turns
    line.wake_first()  # nobody waits: nothing to do


@in_a_loop
async def test_a_cancelled_waiter_leaves_the_line_and_a_wake_it_got_goes_to_the_next():
    line = PlaceLine()
    first, second = asyncio.create_task(line.wait(UNWOKEN_S)), asyncio.create_task(line.wait(UNWOKEN_S))
    await asyncio.sleep(0)
    line.wake_first()
    first.cancel()  # woken and cancelled in the same turn of the loop
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await asyncio.wait_for(second, HANG_S) is True
    third = asyncio.create_task(line.wait(UNWOKEN_S))
    await asyncio.sleep(0)
    third.cancel()
    with pytest.raises(asyncio.CancelledError):
        await third
    assert not line.turns


@in_a_loop
async def test_wake_all_wakes_every_waiter():
    line = PlaceLine()
    waiters = [asyncio.create_task(line.wait(UNWOKEN_S)) for _ in range(3)]
    await asyncio.sleep(0)
    line.wake_all()
    assert await asyncio.gather(*waiters) == [True, True, True]


@in_a_loop
async def test_a_request_for_an_adapter_goes_to_the_replica_that_holds_it():
    """Serve's multiplexed routing, kept by this router: the adapter's key (its
    `multiplexed_model_id`) sends every request to the replica holding it while it has room,
    however busier than the other it gets; a request of the base goes to the less busy."""
    holder, other = FakeReplica("holder", places=100), FakeReplica("other", places=100)
    holder.multiplexed_model_ids = {"adapter#r1#0123"}
    router = await router_of(other, holder)
    for index in range(20):
        request = pending(f"r{index}")
        request.metadata.multiplexed_model_id = "adapter#r1#0123"
        assert await sent(router, request) is holder
    assert await sent(router, pending("base")) is other
