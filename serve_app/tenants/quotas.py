"""Per-tenant limits: requests and tokens per minute (held across ingress replicas in the
`limits` library's storage), requests in flight with a queue of the tenant's own (per ingress
replica), and the OpenAI rate-limit headers every response of a limited tenant carries.

Rates use `limits`' sliding window counter: constant storage per tenant whatever the cost of a
hit (a moving window keeps an entry per token), at the price of approximating the window by
the current and previous minutes. Tokens are charged in two steps: the prompt's (and the
full-vocabulary weight) before any model work, refused with 429 when they do not fit; the
generated ones after the response, so a tenant can exceed its minute by one response's
generation, and its next request is refused until the window has room.
"""

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from limits import RateLimitItemPerMinute
from limits.aio.strategies import SlidingWindowCounterRateLimiter

from serve_app.errors import APIError
from serve_app.gate import Gate
from serve_app.tenants.keyring import TenantLimits

logger = logging.getLogger("probserve.quotas")


def rate_limit_exceeded(message: str, retry_after_s: float, headers: dict[str, str]) -> APIError:
    return APIError(429, "rate_limit_exceeded", message,
                    headers={**headers, "Retry-After": str(max(1, math.ceil(retry_after_s)))})


def storage_unavailable(retry_after_s: int) -> APIError:
    return APIError(503, "rate_limit_unavailable", "the rate-limit storage cannot be reached, and "
                    "this service refuses requests it cannot count (on_storage_failure: closed)",
                    headers={"Retry-After": str(retry_after_s)})


def duration(seconds: float) -> str:
    """OpenAI's reset format: `6m0s`, `1s`."""
    whole = max(0, math.ceil(seconds))
    minutes, rest = divmod(whole, 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


@dataclass(frozen=True)
class Window:
    limit: int
    remaining: int
    reset_s: float


def headers(kind: str, window: Window) -> dict[str, str]:
    return {f"x-ratelimit-limit-{kind}": str(window.limit),
            f"x-ratelimit-remaining-{kind}": str(max(0, window.remaining)),
            f"x-ratelimit-reset-{kind}": duration(window.reset_s)}


class RateLimits:
    """Requests and tokens per minute per tenant, in `storage` (a `limits.aio` storage)."""

    def __init__(self, storage, on_failure: Literal["open", "closed"], retry_after_s: int,
                 clock: Callable[[], float] = time.time):
        self.limiter = SlidingWindowCounterRateLimiter(storage)
        self.on_failure, self.retry_after_s, self.clock = on_failure, retry_after_s, clock

    async def window(self, item, tenant: str, kind: str) -> Window:
        stats = await self.limiter.get_window_stats(item, tenant, kind)
        return Window(item.amount, stats.remaining, stats.reset_time - self.clock())

    async def charge(self, tenant: str, kind: str, per_minute: int | None, cost: int,
                     what: str) -> dict[str, str]:
        """Takes `cost` from the tenant's minute, or raises 429 (with the headers) when it does
        not fit; returns the headers after the charge. No limit: no headers."""
        if per_minute is None:
            return {}
        item = RateLimitItemPerMinute(per_minute)
        try:
            allowed = cost == 0 or await self.limiter.hit(item, tenant, kind, cost=cost)
            window = await self.window(item, tenant, kind)
        except Exception as error:
            return self.failed(error)
        if not allowed:
            reason = (f"{what} ({cost}) exceed this tenant's whole limit of {per_minute} {kind} per "
                      "minute" if cost > per_minute else
                      f"this tenant's limit of {per_minute} {kind} per minute is reached")
            raise rate_limit_exceeded(reason, window.reset_s, headers(kind, window))
        return headers(kind, window)

    async def add_after(self, tenant: str, per_minute: int | None, tokens: int) -> None:
        """Generated tokens, charged once the response is over: all of them if they fit, else
        what is left of the window, which then refuses the tenant's next request."""
        if per_minute is None or tokens <= 0:
            return
        item = RateLimitItemPerMinute(per_minute)
        try:
            if not await self.limiter.hit(item, tenant, "tokens", cost=tokens):
                left = (await self.window(item, tenant, "tokens")).remaining
                if left > 0:
                    await self.limiter.hit(item, tenant, "tokens", cost=left)
        except Exception as error:
            logger.error("rate-limit storage failed while charging %s generated tokens to %r: %s",
                         tokens, tenant, error)

    def failed(self, error: Exception) -> dict[str, str]:
        """The storage is unreachable: the configured policy, logged."""
        logger.error("rate-limit storage failed (%s: %s); policy: fail %s", type(error).__name__,
                     error, self.on_failure)
        if self.on_failure == "open":
            return {}
        raise storage_unavailable(self.retry_after_s) from None


def request_tokens(prompt_tokens: int, full_vocab_positions: int, limits: TenantLimits) -> int:
    """What a request costs before it runs: its prompt, and each full-vocabulary position
    weighted by what writing it costs."""
    return prompt_tokens + full_vocab_positions * (limits.full_vocab_token_weight - 1)


class TenantQueues:
    """Each tenant's requests (or full-vocabulary requests) in flight on this ingress replica,
    within its bound; beyond it they wait in the tenant's own queue, at most `max_waiting` of
    them and at most `wait_s` each, else 429. One tenant's flood so waits behind itself, costing
    no work while it waits, instead of filling the queues every tenant shares."""

    def __init__(self, what: str):
        self.what = what
        self.gates: dict[str, Gate] = {}

    async def enter(self, tenant: str, bound: int | None, max_waiting: int,
                    wait_s: float) -> Callable[[], None]:
        """A place (waiting for one if need be); returns its release."""
        if bound is None:
            return lambda: None
        gate = self.gates.get(tenant)
        if gate is None or gate.bound != bound:  # new, or the key file changed the bound
            gate = self.gates[tenant] = Gate(bound)
        return await gate.enter(max_waiting, wait_s, self.refusal)

    def refusal(self, gate: Gate) -> APIError:
        return rate_limit_exceeded(f"this tenant has {gate.bound} {self.what} in flight, its "
                                   f"limit, and {gate.waiting} waiting: retry later", 1, {})
