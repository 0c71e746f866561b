"""The models' request router: a request that finds every replica full waits in a PlaceLine,
woken in order when a request of the router ends, and finds the freed place without asking
the replicas again; Serve's backoff remains only as the longest wait before looking again.
Requests that share a prefix go to the replica sent it, within the load bound, in their
tenant's and adapter's namespace; a replica that leaves takes only its prefixes along."""

import asyncio
import random

import pytest
from ray.serve._private.common import DeploymentHandleSource, DeploymentID, ReplicaID, RequestMetadata
from ray.serve._private.request_router.common import PendingRequest

from serve_app.config import PrefixRoutingConfig
from serve_app.engine.wire import ONLINE, Adapter, EngineRequest
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
        self.answers = asyncio.Event()  # cleared: a replica slow to say its queue length
        self.answers.set()

    async def get_queue_len(self, *, deadline_s: float) -> int:
        self.asked += 1
        await self.answers.wait()
        return self.ongoing


def pending(name: str) -> PendingRequest:
    metadata = RequestMetadata(request_id=name, internal_request_id=name)
    return PendingRequest(args=[], kwargs={}, metadata=metadata)


def scoring(name: str, prompt: list[int], tenant: str = "alpha", adapter: Adapter | None = None,
            http_request: str | None = None) -> PendingRequest:
    """A pending engine request that scores `prompt`, as the ingress routes it: the calls
    made for one HTTP request share its internal id."""
    request = EngineRequest(prompt_token_ids=prompt, max_tokens=1, temperature=0, top_p=1, prompt_logprobs=1,
                            tenant=tenant, priority=ONLINE, adapter=adapter)
    metadata = RequestMetadata(request_id=name, internal_request_id=http_request or name,
                               multiplexed_model_id=adapter.key if adapter else "")
    return PendingRequest(args=[request], kwargs={}, metadata=metadata)


def question(seed: int) -> list[int]:
    """A context of three of the tests' prefix blocks, of its own."""
    return [seed * 1000 + i for i in range(3 * BLOCK)]


BLOCK = 4
BY_PREFIX = PrefixRoutingConfig().model_dump()


async def router_of(*replicas: FakeReplica, backoff_s: float = UNWOKEN_S,
                    prefix_routing: dict | None = None) -> BoundedStreamRouter:
    router = BoundedStreamRouter(deployment_id=DEPLOYMENT, handle_source=DeploymentHandleSource.UNKNOWN,
                                 use_replica_queue_len_cache=True, initial_backoff_s=backoff_s,
                                 max_backoff_s=backoff_s)
    router.initialize_state(stream_items_ahead=2, prefix_routing=prefix_routing, prefix_block_tokens=BLOCK)
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


async def settled(router: BoundedStreamRouter) -> None:
    """The queue lengths the router asked for meanwhile landed in its cache, then the true ones
    (a fake replica answers its count when asked, before the request it was asked for)."""
    await asyncio.sleep(0.01)
    for replica_id, replica in router._replicas.items():
        router.on_new_queue_len_info(replica_id, replica.ongoing)


async def choices_sent(router: BoundedStreamRouter, context: list[int], name: str,
                       **owner) -> list[FakeReplica]:
    """Where a question's four choices went, routed at once as the ingress sends a prompt list
    (the calls of one HTTP request)."""
    requests = [scoring(f"{name}-{choice}", [*context, choice], http_request=name, **owner)
                for choice in range(4)]
    routed = asyncio.gather(*(sent(router, request) for request in requests))
    went = list(await asyncio.wait_for(routed, HANG_S))
    await settled(router)
    return went


@in_a_loop
async def test_the_choices_of_a_question_go_to_one_replica_and_questions_spread_by_load():
    replicas = [FakeReplica(name, places=100) for name in ("r1", "r2")]
    router = await router_of(*replicas, prefix_routing=BY_PREFIX)
    holders = []
    for index in range(8):
        went = await choices_sent(router, question(index), f"q{index}")
        assert len(set(went)) == 1, [replica.replica_id.unique_id for replica in went]
        holders.append(went[0])
    assert {holder.ongoing for holder in replicas} == {16}  # four questions each


@in_a_loop
async def test_without_prefix_routing_a_questions_choices_spread():
    replicas = [FakeReplica(name, places=100) for name in ("r1", "r2")]
    router = await router_of(*replicas)
    went = [await sent(router, scoring(f"c{choice}", [*question(1), choice])) for choice in range(4)]
    assert set(went) == set(replicas)  # the less loaded of the two, each time


@in_a_loop
async def test_a_holder_past_the_load_bound_leaves_the_request_to_the_less_loaded():
    holder, other = FakeReplica("holder", places=100), FakeReplica("other", places=100)
    router = await router_of(holder, other, prefix_routing=BY_PREFIX)
    router.prefixes.sent(holder.replica_id, router.request_prefix(scoring("seen", question(1))))
    holder.ongoing, other.ongoing = 7, 1  # with one more, 8: within 1.5 x the mean (4.5) + 4
    router.on_new_queue_len_info(holder.replica_id, holder.ongoing)
    router.on_new_queue_len_info(other.replica_id, other.ongoing)
    assert await sent(router, scoring("within", [*question(1), 1])) is holder
    holder.ongoing = 20  # with one more, 21: past 1.5 x 11 + 4
    await settled(router)
    assert await sent(router, scoring("past", [*question(1), 2])) is other


@in_a_loop
async def test_a_full_holder_leaves_the_request_to_a_replica_with_room():
    replicas = [FakeReplica(name, places=1) for name in ("r1", "r2")]
    router = await router_of(*replicas, prefix_routing=BY_PREFIX)
    holder = await sent(router, scoring("first", [*question(1), 0]))
    await settled(router)
    assert await sent(router, scoring("second", [*question(1), 1])) is not holder


@in_a_loop
async def test_a_replica_that_leaves_takes_only_its_prefixes_and_one_that_joins_gets_new_ones():
    random.seed(0)
    replicas = {name: FakeReplica(name, places=100) for name in ("r1", "r2", "r3")}
    router = await router_of(*replicas.values(), prefix_routing=BY_PREFIX)
    held = {index: set(await choices_sent(router, question(index), f"q{index}")) for index in range(6)}
    assert all(len(holders) == 1 for holders in held.values())
    joined = FakeReplica("r4", places=100)
    router.update_replicas([replicas["r1"], replicas["r3"], joined])
    await settled(router)
    for index, (holder,) in held.items():
        (now,) = set(await choices_sent(router, question(index), f"again{index}"))
        assert now is holder or holder is replicas["r2"], (index, holder.replica_id, now.replica_id)
    new = [set(await choices_sent(router, question(index), f"new{index}")) for index in range(6, 12)]
    assert {joined} in new  # the idle newcomer takes new prefixes, by load


@in_a_loop
async def test_tenants_and_adapters_never_route_by_each_others_prefixes():
    busy, idle = FakeReplica("busy", places=100), FakeReplica("idle", places=100)
    router = await router_of(busy, idle, prefix_routing=BY_PREFIX)
    router.prefixes.sent(busy.replica_id, router.request_prefix(scoring("alpha", question(1))))
    busy.ongoing = 3  # within the bound: alpha's requests of that prefix still go to it
    router.on_new_queue_len_info(busy.replica_id, busy.ongoing)
    assert await sent(router, scoring("alpha-again", [*question(1), 1])) is busy
    assert await sent(router, scoring("beta", [*question(1), 1], tenant="beta")) is idle
    assert await sent(router, scoring("alpha-adapter", [*question(1), 1],
                                      adapter=Adapter("a", "/x/a"))) is idle


@in_a_loop
async def test_an_adapters_choices_go_to_one_of_the_replicas_that_hold_it():
    replicas = [FakeReplica(name, places=100) for name in ("r1", "r2", "r3")]
    adapter = Adapter("a", "/x/a")
    for replica in replicas[1:]:
        replica.multiplexed_model_ids = {adapter.key}
    router = await router_of(*replicas, prefix_routing=BY_PREFIX)
    for index in range(4):
        went = set(await choices_sent(router, question(index), f"q{index}", adapter=adapter))
        assert len(went) == 1 and replicas[0] not in went


@in_a_loop
async def test_a_replica_chosen_for_a_request_goes_to_that_request_not_an_older_one():
    """The first question's replica must be asked its queue length (slowly); meanwhile the
    second question's replica is chosen and sent, to the second question's request: Serve's
    FIFO order would have given it to the first, the older, and split its prefix."""
    first, second = FakeReplica("first", places=100), FakeReplica("second", places=100)
    router = await router_of(first, second, prefix_routing=BY_PREFIX)
    requests = [scoring(f"q{index}", [*question(index), 0]) for index in (1, 2)]
    for replica, request in zip((first, second), requests, strict=True):
        router.prefixes.sent(replica.replica_id, router.request_prefix(request))
    first.answers.clear()
    router._replica_queue_len_cache.invalidate_key(first.replica_id)
    older = place(router, requests[0])
    await asyncio.sleep(0.01)
    assert await asyncio.wait_for(sent(router, requests[1]), HANG_S) is second
    assert not older.done()
    first.answers.set()
    assert await asyncio.wait_for(older, HANG_S) is first
