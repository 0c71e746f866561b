"""A model's online requests are answered or refused within its `max_answer_s` however fast its
engine is. The main model's replica, its bound set to 2 s for the test (the session's config
keeps the default for the tests that load the model), its engine slowed to a fifth of its speed
(the process stopped four fifths of every 50 ms, as a machine five times slower, or a neighbour
taking its cores, would leave it), takes a burst of generations that would take it far longer
than the bound: every request gets its answer or a 503 `overloaded` naming the bound, with a
Retry-After, within the bound and what the ingress adds; the replica's measure of its engine
follows the slowdown."""

import asyncio
import time

import httpx
import psutil
import pytest
from ray import serve

from bench.slowdown import slowed
from serve_app.ops.app import model_deployment_name
from serve_app.ops.local_ray import APP_NAME
from tests.e2e.conftest import MODEL
from tests.e2e.test_metrics import unique_prompt

ANSWER_BOUND_S = 2
RUNNING_SHARE = 0.2
BURST = 240
# What the ingress and HAProxy add to the last answer of a burst, beyond the replica's bound:
# parsing, tokenizing and relaying this many requests on two cores.
INGRESS_S = 3
BODY = {"model": MODEL, "max_tokens": 32, "temperature": 0}
SIZE_TOKENS = 40  # about one request's prompt and generation


def replica():
    return serve.get_deployment_handle(model_deployment_name(MODEL), app_name=APP_NAME)


@pytest.fixture
def bounded():
    configured = replica().bound_answers.remote(ANSWER_BOUND_S).result()
    yield
    replica().bound_answers.remote(configured).result()


async def burst(base_url: str) -> list[tuple[httpx.Response, float]]:
    """Every request sent at once: each response and the seconds it took."""
    async with httpx.AsyncClient(base_url=base_url, timeout=120,
                                 limits=httpx.Limits(max_connections=BURST)) as client:
        async def timed(prompt: list[int]) -> tuple[httpx.Response, float]:
            started = time.monotonic()
            response = await client.post("/v1/completions", json={**BODY, "prompt": prompt})
            return response, time.monotonic() - started
        return await asyncio.gather(*(timed(unique_prompt(8)) for _ in range(BURST)))


def test_a_burst_on_a_slowed_engine_is_answered_or_refused_within_the_bound(base_url, bounded, capsys):
    (pid,) = replica().engine_core_pids.remote().result()
    before_s = replica().engine_seconds.remote(SIZE_TOKENS).result()
    with slowed([psutil.Process(pid)], RUNNING_SHARE):
        answers = asyncio.run(burst(base_url))
        slowed_s = replica().engine_seconds.remote(SIZE_TOKENS).result()
    statuses = [response.status_code for response, _ in answers]
    slowest = max(seconds for _, seconds in answers)
    with capsys.disabled():
        print(f"\nburst: {statuses.count(200)} answered, {statuses.count(503)} refused, the last after "
              f"{slowest:.1f} s; the engine's seconds for {SIZE_TOKENS} tokens {before_s:.4f}, slowed "
              f"{slowed_s:.4f}")
    assert slowest <= ANSWER_BOUND_S + INGRESS_S, sorted(seconds for _, seconds in answers)[-10:]
    assert set(statuses) == {200, 503}, statuses  # some answered, the rest refused
    for response, _ in answers:
        if response.status_code == 503:
            error = response.json()["error"]
            assert error["code"] == "overloaded", error
            assert f"max_answer_s ({ANSWER_BOUND_S:g} s)" in error["message"], error
            assert int(response.headers["retry-after"]) >= 1
    assert slowed_s > 1.5 * before_s, (before_s, slowed_s)
