"""Admission by time: a model replica takes an online request only if it expects to answer it
within the model's bound (`max_answer_s`), and refuses it at once otherwise, saying when to
come back.

A count of requests cannot keep a time: how long 128 requests take depends on the machine,
the model, the prompts and whatever else shares the engine. So the replica measures its engine
(`EngineShares`: each request charged its share of the engine's time; `ServiceRate`: seconds per
request and per token, fitted over the recent shares) and adds up the work already ahead of a
new request (online requests waiting or in the engine, background
ones in it); a request whose wait would exceed what the bound leaves it is refused.

How many requests are in the engine at once adapts too (`GradientLimit`, after Netflix's
concurrency-limits Gradient2): it grows while requests take no longer, relative to their size,
than they have been taking, and shrinks when they take longer. Requests beyond it wait in the
replica, first come first served, where a late one is still refused within the bound rather
than held in the engine's own queue.
"""

import math
import time
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

from serve_app.engine.wire import Late
from serve_app.gate import Gate


@dataclass(frozen=True)
class Work:
    """What one request asks of the engine: its prompt tokens and the tokens it may generate
    (every sequence's). Measured and estimated alike by these counts, the rate takes in what
    they leave out (a prefix read from the cache, a generation stopped early)."""

    prompt_tokens: int
    generated_tokens: int

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.generated_tokens


class ServiceRate:
    """A request's share of the engine's time as `per_request_s + per_token_s * tokens`, fitted
    by least squares over the requests that left the engine, each weighing `decay` of the one
    after it. A first guess (the replica's warm-up) stands as two light samples that never fade,
    one of a request and one of TOKEN_SCALE tokens alone, PRIOR_WEIGHT of a real one each: it
    decides only what the samples cannot tell apart (requests all of one size say nothing of a
    token's share)."""

    TOKEN_SCALE, PRIOR_WEIGHT = 100, 0.001

    def __init__(self, per_request_s: float, per_token_s: float, decay: float = 0.95):
        self.decay = decay
        self.prior = Sums()
        self.prior.add(1, 0, per_request_s)
        self.prior.add(0, self.TOKEN_SCALE, self.TOKEN_SCALE * per_token_s)
        self.prior.scale(self.PRIOR_WEIGHT)
        self.observed = Sums()
        self.per_request_s, self.per_token_s = per_request_s, per_token_s

    def observe(self, tokens: int, share_s: float) -> None:
        """A request of `tokens` that took `share_s` of the engine's time."""
        self.observed.scale(self.decay)
        self.observed.add(1, tokens, share_s)
        self.per_request_s, self.per_token_s = self.observed.plus(self.prior).fit()

    def seconds(self, requests: int, tokens: int) -> float:
        return self.per_request_s * requests + self.per_token_s * tokens


@dataclass
class Sums:
    """The normal equations of seconds over (requests, tokens)."""

    rr: float = 0.0
    rt: float = 0.0
    tt: float = 0.0
    rs: float = 0.0
    ts: float = 0.0

    def add(self, requests: float, tokens: float, seconds: float) -> None:
        self.rr += requests * requests
        self.rt += requests * tokens
        self.tt += tokens * tokens
        self.rs += requests * seconds
        self.ts += tokens * seconds

    def scale(self, factor: float) -> None:
        for name, value in vars(self).items():
            setattr(self, name, value * factor)

    def plus(self, other: "Sums") -> "Sums":
        return Sums(**{name: value + getattr(other, name) for name, value in vars(self).items()})

    def fit(self) -> tuple[float, float]:
        """(per request, per token), neither negative: where the best fit has one below zero,
        the other axis alone."""
        determinant = self.rr * self.tt - self.rt * self.rt
        per_request = (self.rs * self.tt - self.ts * self.rt) / determinant
        per_token = (self.ts * self.rr - self.rs * self.rt) / determinant
        if per_token < 0:
            return max(self.rs / self.rr, 0.0), 0.0
        if per_request < 0:
            return 0.0, max(self.ts / self.tt, 0.0)
        return per_request, per_token


class EngineShares:
    """Each request's share of the engine's time: while n requests are in the engine, each is
    charged 1/n of every second (fair queueing's virtual time). The shares of the requests that
    leave add up to the engine's busy time, each by what it took of it, whether alone or in a
    batch of hundreds."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.in_engine = 0
        self.virtual_s = 0.0  # seconds charged to each request in the engine since the start
        self.at = clock()

    def advance(self) -> float:
        now = self.clock()
        if self.in_engine:
            self.virtual_s += (now - self.at) / self.in_engine
        self.at = now
        return self.virtual_s

    def entered(self) -> float:
        """The mark the request's share is counted from."""
        mark = self.advance()
        self.in_engine += 1
        return mark

    def left(self, mark: float) -> float:
        """The share of the request that entered at `mark`."""
        share_s = self.advance() - mark
        self.in_engine -= 1
        return share_s


class GradientLimit:
    """Requests in the engine at once, adapted as Gradient2 adapts a concurrency limit: each
    request's stretch (its time in the engine over its size in ServiceRate's seconds) is
    averaged over the last few (`short_samples`) and over many (`long_samples`); the limit
    grows by its square root while the short average is within `tolerance` of the long one,
    and shrinks in proportion (by half at most) when it is not, smoothed. While fewer than half
    its places are used it stays: such samples say nothing of more."""

    def __init__(self, initial: int, minimum: int, maximum: int, tolerance: float = 1.5,
                 smoothing: float = 0.2, short_samples: int = 10, long_samples: int = 500):
        self.limit, self.minimum, self.maximum = float(initial), minimum, maximum
        self.tolerance, self.smoothing = tolerance, smoothing
        self.short_samples, self.long_samples = short_samples, long_samples
        self.short = self.long = 0.0
        self.samples = 0

    def observe(self, stretch: float, in_engine: int) -> None:
        """A request that spent `stretch` times its size in the engine, which held `in_engine`
        requests (itself among them) as it left."""
        self.samples += 1
        self.short += (stretch - self.short) / min(self.samples, self.short_samples)
        self.long += (stretch - self.long) / min(self.samples, self.long_samples)
        if self.long > 2 * self.short:  # a slowdown has passed: the long view follows it down
            self.long *= 0.95
        if in_engine < self.limit / 2:
            return
        gradient = max(0.5, min(1.0, self.tolerance * self.long / self.short))
        proposed = self.limit * gradient + math.sqrt(self.limit)
        smoothed = self.limit * (1 - self.smoothing) + proposed * self.smoothing
        self.limit = min(max(smoothed, self.minimum), self.maximum)

    @property
    def places(self) -> int:
        return int(self.limit)


class TimeAdmission:
    """One replica's admission: an online request refused at once when late, else waiting for
    a place in the engine (GradientLimit's) for what the bound leaves it; background requests
    counted while in the engine, never refused (they wait their turn elsewhere:
    serve_app.engine.background). Without a bound, online requests only wait for places."""

    def __init__(self, bound_s: float | None, rate: ServiceRate, limit: GradientLimit,
                 clock=time.monotonic):
        self.bound_s, self.rate, self.limit, self.clock = bound_s, rate, limit, clock
        self.shares = EngineShares(clock)
        self.places = Gate(limit.places)
        self.ahead_requests = self.ahead_tokens = 0  # admitted online, and background in the engine

    def ahead_s(self) -> float:
        return self.rate.seconds(self.ahead_requests, self.ahead_tokens)

    def allowed_wait_s(self, own_s: float) -> float:
        """What the bound leaves a request of `own_s` to wait: the bound less its own time,
        and half the bound at least, so that one the engine takes long for even alone is not
        refused whenever anything is ahead of it."""
        return math.inf if self.bound_s is None else max(self.bound_s - own_s, self.bound_s / 2)

    def check(self, work: Work) -> float:
        """The wait the request is allowed; Late when the work ahead exceeds it."""
        own_s, ahead_s = self.rate.seconds(1, work.tokens), self.ahead_s()
        allowed_s = self.allowed_wait_s(own_s)
        if ahead_s > allowed_s:
            raise Late(f"the model's replica has {ahead_s:.1f} s of work ahead of this request, "
                       f"which would not be answered within max_answer_s ({self.bound_s:g} s): "
                       "retry later", ahead_s - allowed_s)
        return allowed_s

    @asynccontextmanager
    async def online(self, work: Work):
        """Admitted, then a place in the engine for the body; Late if refused at once or if no
        place frees within the allowed wait."""
        allowed_s = self.check(work)
        with self.counted_ahead(work):
            release = await self.places.enter(math.inf, allowed_s, lambda _: self.late(work, allowed_s))
            try:
                with self.in_engine(work):
                    yield
            finally:
                release()

    @asynccontextmanager
    async def background(self, work: Work):
        with self.counted_ahead(work), self.in_engine(work, sampled=False):
            yield

    def late(self, work: Work, allowed_s: float) -> Late:
        waited_for = self.ahead_s() - self.rate.seconds(1, work.tokens)
        return Late(f"no place in the model's engine within the {allowed_s:.1f} s that max_answer_s "
                    f"({self.bound_s:g} s) leaves this request: retry later", max(waited_for, 0.0))

    @contextmanager
    def counted_ahead(self, work: Work):
        self.ahead_requests, self.ahead_tokens = self.ahead_requests + 1, self.ahead_tokens + work.tokens
        try:
            yield
        finally:
            self.ahead_requests, self.ahead_tokens = self.ahead_requests - 1, self.ahead_tokens - work.tokens

    @contextmanager
    def in_engine(self, work: Work, sampled: bool = True):
        """The engine's time on a request: its share measured, and (online requests) its
        stretch given to the limit, which resizes the places."""
        entered_at, mark = self.clock(), self.shares.entered()
        try:
            yield
        finally:
            in_engine = self.shares.in_engine
            self.rate.observe(work.tokens, self.shares.left(mark))
            if sampled:
                size_s = max(self.rate.seconds(1, work.tokens), 1e-6)
                self.limit.observe((self.clock() - entered_at) / size_s, in_engine)
                self.places.resize(self.limit.places)
