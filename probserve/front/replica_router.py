"""The request router of the model replicas' deployments: Ray Serve's own (the power of two
choices), with full-vocabulary streams that run ahead of their caller by a bound.

Ray Serve calls a replica's streaming method without Ray's generator backpressure, so a
replica computed a prompt's windows as fast as its engine could, and Ray's object store held
every window's rows until the serializer pool wrote them: 200 MB at 1,024 positions of
SmolLM2, and the store keeps the pages it has written. Here a `generate_full_vocab` call asks
Ray for it: the replica pauses once `stream_items_ahead` items of its stream wait untaken
(probserve.engine.windows), and goes on as the ingress takes them.

A router, not a patch: Serve pickles its own router package by value into every handle's
process, which puts back any method changed there (probserve.engine.vllm_fence, item 6).
"""

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


class BoundedStreamRouter(PowerOfTwoChoicesRequestRouter):
    def initialize_state(self, stream_items_ahead: int) -> None:
        self.stream_items_ahead = stream_items_ahead

    def create_replica_wrapper(self, replica_info) -> RunningReplica:
        return BoundedStreamReplica(replica_info, self.stream_items_ahead)
