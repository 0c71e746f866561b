"""The request router of the model replicas' deployments: Ray Serve's own (the power of two
choices), with full-vocabulary streams that run ahead of their caller by a bound, and requests
that wait for a place woken when one frees.

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
    def initialize_state(self, stream_items_ahead: int) -> None:
        self.stream_items_ahead = stream_items_ahead
        self.place_line = PlaceLine()
        self.unwoken: weakref.WeakSet[asyncio.Task] = weakref.WeakSet()  # routing tasks to ask again

    def create_replica_wrapper(self, replica_info) -> RunningReplica:
        return BoundedStreamReplica(replica_info, self.stream_items_ahead)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        """Serve's two random choices, unless both are full and another replica has room (by
        the queue-length cache): then two of those, so that a woken request finds the place.

        First it lets the request given a replica by the last choice be sent: Serve counts a
        request in the cache as it sends it, and a routing task chooses again, for the next
        waiting request, without yielding in between, so one freed place was given to every
        waiting request, and all but one were sent only to be refused by the replica and
        routed again (at 128 clients on one replica, two sends a request)."""
        await asyncio.sleep(0)
        ranks = await super().choose_replicas(candidate_replicas, pending_request)
        chosen = [replica for rank in ranks for replica in rank]
        if not chosen or self.select_available_replicas(chosen):
            return ranks
        with_room = self.select_available_replicas(candidate_replicas)
        return [random.sample(with_room, min(2, len(with_room)))] if with_room else ranks

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
        """New replicas have room for every waiter."""
        super().update_replicas(replicas)
        self.place_line.wake_all()
