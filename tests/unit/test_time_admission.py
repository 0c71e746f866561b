import asyncio
import math
import pickle

import pytest

from serve_app.engine.time_admission import (
    EngineShares,
    GradientLimit,
    ServiceRate,
    TimeAdmission,
    Work,
)
from serve_app.engine.wire import Late


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_rate_finds_the_seconds_a_request_and_a_token_cost():
    rate = ServiceRate(per_request_s=0.2, per_token_s=0.01)  # a guess ten times the truth
    for tokens in [20, 300, 5, 100] * 30:
        rate.observe(tokens, 0.02 + 0.001 * tokens)
    assert (rate.per_request_s, rate.per_token_s) == pytest.approx((0.02, 0.001), rel=1e-3)
    assert rate.seconds(2, 50) == pytest.approx(0.09, rel=1e-3)


def test_requests_all_of_one_size_are_predicted_and_the_guess_splits_them():
    rate = ServiceRate(per_request_s=0.01, per_token_s=0.001)
    for _ in range(100):
        rate.observe(60, 0.1)
    assert rate.seconds(1, 60) == pytest.approx(0.1, rel=0.01)
    assert rate.per_request_s > 0 and rate.per_token_s > 0


def test_a_fit_below_zero_on_one_axis_takes_the_other_alone():
    rate = ServiceRate(per_request_s=0.0, per_token_s=0.0)
    for tokens, share_s in [(10, 0.6), (1000, 0.5)] * 30:  # longer, yet no slower
        rate.observe(tokens, share_s)
    assert rate.per_token_s == 0 and rate.per_request_s == pytest.approx(0.55, rel=0.01)


def test_the_recent_requests_weigh_most():
    rate = ServiceRate(per_request_s=0.01, per_token_s=0.0)
    for _ in range(100):
        rate.observe(10, 0.01)
    for _ in range(20):  # the machine slows down five times
        rate.observe(10, 0.05)
    assert rate.seconds(1, 10) > 0.03  # most of the way after twenty requests
    for _ in range(80):
        rate.observe(10, 0.05)
    assert rate.seconds(1, 10) == pytest.approx(0.05, rel=0.1)


def test_each_request_is_charged_its_share_of_the_engine_s_time():
    clock = Clock()
    shares = EngineShares(clock)
    first = shares.entered()
    clock.now = 1.0  # alone for a second
    second = shares.entered()
    clock.now = 3.0  # two for two seconds: a second each
    assert shares.left(first) == pytest.approx(2.0)
    clock.now = 10.0  # alone again for seven
    assert shares.left(second) == pytest.approx(8.0)
    clock.now = 20.0  # idle: nobody is charged
    third = shares.entered()
    clock.now = 20.5
    assert shares.left(third) == pytest.approx(0.5) and shares.in_engine == 0


def test_the_limit_grows_while_requests_take_as_long_as_before_and_shrinks_when_slower():
    limit = GradientLimit(initial=16, minimum=4, maximum=64)
    for _ in range(300):
        limit.observe(stretch=2.0, in_engine=limit.places)
    assert limit.places == 64
    for _ in range(30):
        limit.observe(stretch=8.0, in_engine=limit.places)
    assert limit.places < 40


def test_the_limit_stays_while_fewer_than_half_its_places_are_used():
    limit = GradientLimit(initial=16, minimum=4, maximum=64)
    for stretch in (1.0, 5.0, 1.0):
        limit.observe(stretch, in_engine=7)
    assert limit.places == 16


def test_the_limit_keeps_within_its_bounds():
    limit = GradientLimit(initial=8, minimum=4, maximum=64)
    for _ in range(200):
        limit.observe(1.0, in_engine=limit.places)
    assert limit.places == 64
    for _ in range(100):
        limit.observe(100.0, in_engine=limit.places)
    assert limit.places == 4


def fixed_rate(per_request_s: float) -> ServiceRate:
    rate = ServiceRate(per_request_s, 0.0)
    rate.observe = lambda *_: None  # held where the test sets it
    return rate


def admission(bound_s: float | None, places: int, per_request_s: float = 1.0) -> TimeAdmission:
    return TimeAdmission(bound_s, fixed_rate(per_request_s), GradientLimit(places, places, places))


ONE = Work(prompt_tokens=5, generated_tokens=1)


def test_requests_are_admitted_while_the_work_ahead_leaves_them_within_the_bound():
    async def run():
        gate = admission(bound_s=4.0, places=16)
        holding = asyncio.Event()
        admitted = []

        async def hold():
            async with gate.online(ONE):
                admitted.append(True)
                await holding.wait()
        tasks = [asyncio.create_task(hold()) for _ in range(3)]
        await asyncio.sleep(0)
        assert gate.ahead_s() == 3.0
        with pytest.raises(Late) as late:  # 3 s ahead, its own 1 s: 4 s, within; a fourth is not
            tasks.append(asyncio.create_task(hold()))
            await asyncio.sleep(0)
            async with gate.online(ONE):
                pass
        assert late.value.retry_after_s == pytest.approx(1.0)
        assert "4.0 s of work ahead" in str(late.value) and "max_answer_s (4 s)" in str(late.value)
        holding.set()
        await asyncio.gather(*tasks)
        assert len(admitted) == 4 and gate.ahead_s() == 0
    asyncio.run(run())


def test_a_request_the_engine_takes_long_for_alone_waits_half_the_bound():
    gate = admission(bound_s=4.0, places=16, per_request_s=10.0)
    assert gate.check(ONE) == 2.0  # alone: admitted
    gate.ahead_requests = 1  # 10 s ahead, more than half the bound
    with pytest.raises(Late):
        gate.check(ONE)


def test_without_a_bound_nothing_is_refused():
    gate = admission(bound_s=None, places=16)
    gate.ahead_requests = 10_000
    assert gate.check(ONE) == math.inf


def test_a_request_that_finds_no_place_within_its_wait_is_refused_and_leaves_nothing_counted():
    async def run():
        gate = admission(bound_s=2.5, places=1, per_request_s=0.01)
        gate.allowed_wait_s = lambda own_s: 0.05
        release = asyncio.Event()

        async def hold():
            async with gate.online(ONE):
                await release.wait()
        holder = asyncio.create_task(hold())
        await asyncio.sleep(0)
        with pytest.raises(Late, match="no place in the model's engine within the"):
            async with gate.online(ONE):
                pass
        assert gate.ahead_s() == 0.01 and gate.places.waiting == 0
        release.set()
        await holder
        assert gate.ahead_s() == 0 and gate.places.held == 0
    asyncio.run(run())


def test_background_work_in_the_engine_is_ahead_of_online_requests():
    async def run():
        gate = admission(bound_s=2.0, places=16)
        async with gate.background(Work(100, 1)):
            assert gate.ahead_s() == 1.0
            assert gate.places.held == 0  # it takes no online place
        assert gate.ahead_s() == 0
    asyncio.run(run())


def test_the_places_follow_the_limit():
    async def run():
        clock = Clock()
        gate = TimeAdmission(None, fixed_rate(1.0), GradientLimit(4, 2, 8), clock=clock)
        for _ in range(20):
            async with gate.online(ONE):
                clock.now += 1.0
        assert gate.places.bound == gate.limit.places == 4  # one at a time: under half used
        for _ in range(10):
            gate.limit.observe(1.0, in_engine=gate.limit.places)
        async with gate.online(ONE):
            clock.now += 1.0
        assert gate.places.bound == gate.limit.places > 4
    asyncio.run(run())


def test_a_late_refusal_crosses_processes_whole():
    late = pickle.loads(pickle.dumps(Late("too much ahead", 2.5)))
    assert (str(late), late.retry_after_s) == ("too much ahead", 2.5)
