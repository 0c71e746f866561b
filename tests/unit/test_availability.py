import asyncio

from ray.serve._private.common import ReplicaState

from serve_app.observe.availability import ReplicaStates, running_replicas


def details(app: str, **replicas: dict) -> dict:
    """The controller's details, each replica with its state, as Ray's ReplicaState (a str)."""
    deployments = {name: {"replicas": [{"replica_id": f"{name}-{state}-{i}", "state": ReplicaState(state)}
                                       for state, count in states.items() for i in range(count)]}
                   for name, states in replicas.items()}
    return {"applications": {app: {"deployments": deployments}}}


def test_running_replicas_counts_those_serving_of_the_application():
    serve_details = details("probserve", Ingress={"RUNNING": 2},
                            **{"Model-a": {"STARTING": 1}, "Model-b": {"RUNNING": 1, "STOPPING": 1},
                               "Model-c": {"RECOVERING": 1}})
    assert running_replicas(serve_details, "probserve") == {"Ingress": 2, "Model-a": 0, "Model-b": 1,
                                                            "Model-c": 1}
    assert running_replicas(serve_details, "other") == {}


def test_a_request_reads_the_last_counts_and_a_stale_answer_is_refreshed_in_the_background():
    answers = iter([{"Model-a": 1}, {"Model-a": 0}])
    fetches = []

    def fetch():
        fetches.append(1)
        return next(answers)

    async def scenario():
        states = ReplicaStates(fetch, max_age_s=0.05)
        assert states.running("Model-a") is None  # unknown: never refuse on no knowledge
        assert states.running("Model-a") is None  # one refresh at a time
        await asyncio.sleep(0.02)
        assert states.running("Model-a") == 1 and len(fetches) == 1  # fresh: not fetched again
        await asyncio.sleep(0.06)
        assert states.running("Model-a") == 1  # stale: the last answer, while refreshing
        await asyncio.sleep(0.02)
        assert states.running("Model-a") == 0 and len(fetches) == 2
    asyncio.run(scenario())


def test_a_failing_controller_keeps_the_last_counts():
    answers = [{"Model-a": 1}]

    def fetch():
        if not answers:
            raise ConnectionError("controller restarting")
        return answers.pop()

    async def scenario():
        states = ReplicaStates(fetch, max_age_s=0)
        states.running("Model-a")
        await asyncio.sleep(0.02)
        assert states.running("Model-a") == 1
        await asyncio.sleep(0.02)
        assert states.running("Model-a") == 1
    asyncio.run(scenario())


def test_readiness_asks_the_controller_when_it_knows_no_count_yet():
    """A model scaled to zero, asked about before any count came: 0, not unknown (unknown would
    send a health check that waits for, and wakes, a replica)."""
    fetches = []

    def fetch():
        fetches.append(1)
        return {"Model-idle": 0}

    async def scenario():
        states = ReplicaStates(fetch, max_age_s=60)
        assert await asyncio.gather(states.known("Model-idle"), states.known("Model-idle")) == [0, 0]
        assert len(fetches) == 1  # one question for both
        assert await states.known("Model-other") is None  # a fresh answer without it stands
        assert len(fetches) == 1
    asyncio.run(scenario())


def test_readiness_asks_again_once_the_count_is_stale():
    """A replica that started after the first answer: readiness sees it at the next question
    past `max_age_s`, with no request in between to refresh the counts."""
    answers = iter([{"Model-a": 0}, {"Model-a": 1}])

    async def scenario():
        states = ReplicaStates(lambda: next(answers), max_age_s=0.05)
        assert await states.known("Model-a") == 0
        assert await states.known("Model-a") == 0  # fresh: not asked again
        await asyncio.sleep(0.06)
        assert await states.known("Model-a") == 1
    asyncio.run(scenario())
