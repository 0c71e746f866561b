"""The request router of the model replicas' deployments: Ray Serve's own (the power of two
choices), with requests that share a prefix sent to the replica that holds it
(serve_app.front.prefix_affinity), full-vocabulary streams that run ahead of their caller by
a bound, and requests that wait for a place woken when one frees.

Ray Serve calls a replica's streaming method without Ray's generator backpressure, so a
replica computed a prompt's windows as fast as its engine could, and Ray's object store held
every window's rows until the serializer pool wrote them: 200 MB at 1,024 positions of
SmolLM2, and the store keeps the pages it has written. Here a `generate_full_vocab` call asks
Ray for it: the replica pauses once `stream_items_ahead` items of its stream wait untaken
(serve_app.engine.windows), and goes on as the ingress takes them.

A request that finds every replica full waits in Serve's router, which tried again after a
backoff (25 ms doubling to `router_max_backoff_s`), asking the full replicas their queue
lengths each time, whether or not a place had freed. Here it waits in a PlaceLine instead: a
request of this router that ends wakes the longest waiting one at once, which finds the freed
place in the router's queue-length cache without asking; the backoff remains only as the
longest wait before looking again, for places freed by other callers of the replicas (other
ingress replicas, batch and dataset work), which this router does not see end.

A request is routed for itself: Serve's router hands a chosen replica to the oldest waiting
request (its FIFOMixin), which is right when any replica suits any request, and sends a
prefix to a replica chosen for another one. Here each routing task's choice goes to the request
it was made for, as Serve's base router does, found by the identity of its call's metadata.

A router, not a patch: Serve pickles its own router package by value into every handle's
process, which puts back any method changed there (serve_app.engine.vllm_fence.touch_points, item 6).
"""

import asyncio
import random
import weakref
from collections import deque
from types import SimpleNamespace

from ray.serve._private.request_router import PowerOfTwoChoicesRequestRouter
from ray.serve._private.request_router.replica_wrapper import ActorReplicaWrapper
from ray.serve.request_router import PendingRequest, RunningReplica

from serve_app.engine.wire import EngineRequest
from serve_app.front.prefix_affinity import PrefixIndex, prefix_keys

FULL_VOCAB_METHOD = "generate_full_vocab"


class BackpressuredActor:
    """A replica's actor handle whose methods' `options()` add Ray's generator backpressure."""

    def __init__(self, actor, items: int):
        self.actor, self.items = actor, items

    def __getattr__(self, method: str):
        calls = getattr(self.actor, method)
        return SimpleNamespace(options=lambda **options: calls.options(
            **options, _generator_backpressure_num_objects=self.items))


class BoundedStreamReplica(RunningReplica):
    """A replica that sends full-vocabulary calls with backpressure, the others as Serve does."""

    def __init__(self, replica_info, items: int):
        super().__init__(replica_info)
        self.bounded = ActorReplicaWrapper(BackpressuredActor(self._actor_handle, items))

    def try_send_request(self, pr: PendingRequest, with_rejection: bool):
        metadata = pr.metadata
        if metadata.is_streaming and metadata._by_reference and metadata.call_method == FULL_VOCAB_METHOD:
            return self.bounded.send_request_python(pr, with_rejection=with_rejection)
        return super().try_send_request(pr, with_rejection)


class PlaceLine:
    """Waiters for a place on a replica, woken in the order they began to wait."""

    def __init__(self):
        self.turns: deque[asyncio.Future] = deque()

    async def wait(self, at_most_s: float) -> bool:
        """True once woken by a freed place, False after `at_most_s` without one."""
        turn = asyncio.get_running_loop().create_future()
        self.turns.append(turn)
        try:
            async with asyncio.timeout(at_most_s):
                await turn
            return True
        except TimeoutError:
            return False
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.wake_first()  # woken as it was cancelled: the place goes to the next
            raise
        finally:
            if turn in self.turns:
                self.turns.remove(turn)

    def wake_first(self) -> None:
        while self.turns:
            turn = self.turns.popleft()
            if not turn.done():
                turn.set_result(None)
                return

    def wake_all(self) -> None:
        while self.turns:
            self.wake_first()


class BoundedStreamRouter(PowerOfTwoChoicesRequestRouter):
    def initialize_state(self, stream_items_ahead: int, prefix_routing: dict | None = None,
                         prefix_block_tokens: int = 16, shared_prefix_caches: bool = False) -> None:
        """`prefix_routing`: a model's PrefixRoutingConfig, as a dict; none or not enabled:
        Serve's choices alone."""
        self.stream_items_ahead = stream_items_ahead
        self.place_line = PlaceLine()
        self.unwoken: weakref.WeakSet[asyncio.Task] = weakref.WeakSet()  # routing tasks to ask again
        routing = prefix_routing or {"enabled": False}
        self.prefixes = PrefixIndex(routing["index_blocks"], routing["load_factor"], routing["load_slack"]) \
            if routing["enabled"] else None
        self.prefix_block_tokens, self.shared_prefix_caches = prefix_block_tokens, shared_prefix_caches
        # The requests waiting for a replica, by their metadata's identity (each call's own).
        self.pending_by_metadata: dict[int, PendingRequest] = {}
        # Each request's keys, made once whatever its routing tries (by its future: a request
        # routed again gets a new one).
        self.keys_by_request: weakref.WeakKeyDictionary[asyncio.Future, list[int]] = \
            weakref.WeakKeyDictionary()

    def create_replica_wrapper(self, replica_info) -> RunningReplica:
        return BoundedStreamReplica(replica_info, self.stream_items_ahead)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        """The replica that holds the request's prefix, where one has room, then Serve's two
        random choices; where both of those are full and another replica has room (by the
        queue-length cache), two of those instead, so that a woken request finds the place.

        First it lets the request given a replica by the last choice be sent: Serve counts a
        request in the cache as it sends it, and a routing task chooses again, for the next
        waiting request, without yielding in between, so one freed place was given to every
        waiting request, and all but one were sent only to be refused by the replica and
        routed again (at 128 clients on one replica, two sends a request)."""
        await asyncio.sleep(0)
        ranks = await super().choose_replicas(candidate_replicas, pending_request)
        chosen = [replica for rank in ranks for replica in rank]
        if not chosen:
            return ranks
        with_room = self.select_available_replicas(chosen)
        if not with_room:
            with_room = self.select_available_replicas(candidate_replicas)
            ranks = [random.sample(with_room, min(2, len(with_room)))] if with_room else ranks
        if len(candidate_replicas) < 2 or not with_room or not (keys := self.request_prefix(pending_request)):
            return ranks
        preferred = self.holder_of(keys, candidate_replicas, pending_request) \
            or min(with_room, key=self.queue_len)
        self.prefixes.sent(preferred.replica_id, keys)  # now: its siblings are routed next
        return [[preferred], *ranks]

    def request_prefix(self, pending_request: PendingRequest | None) -> list[int]:
        """The keys of the request's leading blocks, in its cache namespace; none for a
        request that is no engine request or where prefix routing is off."""
        request = pending_request.args[0] if pending_request and pending_request.args else None
        if self.prefixes is None or not isinstance(request, EngineRequest):
            return []
        if (keys := self.keys_by_request.get(pending_request.future)) is None:
            namespace = request.cache_namespace(self.shared_prefix_caches)
            keys = prefix_keys(request.prompt_token_ids, self.prefix_block_tokens, namespace)
            self.keys_by_request[pending_request.future] = keys
        return keys

    def holder_of(self, keys: list[int], candidates: list[RunningReplica],
                  pending_request: PendingRequest) -> RunningReplica | None:
        """The replica with room that was sent most of the prefix, within the load bound: of
        those holding the request's adapter where one does (Serve loads it on the others)."""
        with_room = self.select_available_replicas(candidates)
        adapter = pending_request.metadata.multiplexed_model_id
        holding = [replica for replica in with_room if adapter in replica.multiplexed_model_ids]
        among = {replica.replica_id: replica for replica in (holding if adapter and holding else with_room)}
        choice = self.prefixes.choose(keys, {replica_id: self.queue_len(replica)
                                             for replica_id, replica in among.items()})
        return among.get(choice)

    def queue_len(self, replica: RunningReplica) -> int:
        """Requests in flight on the replica by the cache (none known: none)."""
        return self._replica_queue_len_cache.get(replica.replica_id) or 0

    def on_request_routed(self, pending_request: PendingRequest, replica_id, result) -> None:
        """The prefix is held where the request went, if a fallback rank took it elsewhere."""
        if keys := self.request_prefix(pending_request):
            self.prefixes.sent(replica_id, keys)

    def _add_pending_request_to_indices(self, pending_request: PendingRequest) -> None:
        super()._add_pending_request_to_indices(pending_request)
        self.pending_by_metadata[id(pending_request.metadata)] = pending_request

    def _remove_pending_request_from_indices(self, pending_request: PendingRequest) -> None:
        super()._remove_pending_request_from_indices(pending_request)
        self.pending_by_metadata.pop(id(pending_request.metadata), None)

    def _fulfill_next_pending_request(self, replica: RunningReplica, request_metadata=None) -> None:
        """The replica goes to the request it was chosen for, not to the oldest waiting one
        (the FIFOMixin of Serve's power of two choices). Found by its own metadata: Serve's
        base router finds it by its internal request id, which the calls one request makes
        from a replica share (a harness's choices, sent at once), and the others waited forever."""
        pending = self.pending_by_metadata.get(id(request_metadata))
        if pending is None or pending.future.done():
            return
        self._cancel_routing_task_for_pending_request(pending)
        self._record_queue_wait_time(pending)
        pending.future.set_result(replica)
        self._remove_pending_request_from_indices(pending)

    async def _select_from_candidate_replicas(self, candidates: list[RunningReplica],
                                              backoff_index: int) -> RunningReplica | None:
        """Serve's choice between the candidates, which asks each full one its queue length
        again; not while the cache says they are full and the routing task was not left
        unwoken for a whole backoff: the place that woke it went to an earlier request."""
        if asyncio.current_task() in self.unwoken or self.select_available_replicas(candidates):
            self.unwoken.discard(asyncio.current_task())
            return await super()._select_from_candidate_replicas(candidates, backoff_index)
        return None

    async def _backoff(self, attempt: int) -> None:
        if not await self.place_line.wait(self._compute_backoff_s(attempt)):
            self.unwoken.add(asyncio.current_task())

    def decrement_queue_len_cache(self, replica_id) -> None:
        """A request of this router ended on `replica_id`: its place goes to the longest waiter."""
        super().decrement_queue_len_cache(replica_id)
        self.place_line.wake_first()

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        """New replicas have room for every waiter; those gone take their prefixes along."""
        super().update_replicas(replicas)
        if self.prefixes is not None:
            self.prefixes.keep_only(replica.replica_id for replica in replicas)
        self.place_line.wake_all()
