"""A steady mixed load at a fixed rate, and what became of each request while parts of the
service were killed.

bench/chaos.py and tests/e2e/test_chaos.py kill the parts of a local service under it; a
platform team can point the same load at its own deployment while it deletes pods:

    python -m serve_app.ops.chaos --url http://HOST:8000 --model M --rate 8 --seconds 300 --key K1 --key K2

Each request sent ends as exactly one of OUTCOMES (phases() checks that they add up):
- answered: a 200 whose whole body gives the numbers the same request got before the kills:
  each position's token, its log-probability and every entry listed (top-k or the whole
  distribution), bound to its token, within TOLERANCE;
- refused: an error the client can act on: a status with probserve's JSON envelope (or, in a
  stream, an error event), or a connection refused (nothing was taken);
- broken: a body cut off by a transport error: the client knows it is incomplete;
- bare: an error status without the envelope (a load balancer's own page);
- lost: no answer within the timeout;
- wrong: a 200 that is not that answer: other numbers, or a body cut short without a transport
  error, one that does not parse, one without a field the answer has, or any other failure to
  read it.
Lost and wrong must never happen.
"""

import argparse
import asyncio
import itertools
import math
import random
import time
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import numpy as np
import orjson
import psutil

OUTCOMES = ("answered", "refused", "broken", "bare", "lost", "wrong")
FAILED = set(OUTCOMES) - {"answered"}
# The tests' tolerance against a float32 reference: answers computed in other batches differ
# by float32 rounding, far less.
TOLERANCE = 1e-4


class Mismatch(Exception):
    """A 200 body that is not a whole answer of the expected shape."""


class Refused(Exception):
    """An error the service reported in its envelope: its code."""


class Bare(Exception):
    """An error status without probserve's envelope."""


class Unjudged(Exception):
    """Requests sent that no phase counts: the accounting lost them."""


@dataclass(frozen=True)
class Kind:
    """A request of the mix: its body (model filled in later), its share, how it is read."""

    name: str
    body: dict
    weight: float
    read: str = "json"  # json, stream (server-sent events) or full_vocab (gzip JSON)


def standard_kinds(prompt_ids: list[int]) -> list[Kind]:
    """Small requests, echo scoring, streams and full distributions of `prompt_ids`."""
    return [
        Kind("small", {"prompt": prompt_ids[:5], "max_tokens": 1, "logprobs": 5}, 70),
        Kind("echo", {"prompt": prompt_ids, "echo": True, "logprobs": 1, "max_tokens": 1}, 15),
        Kind("stream", {"prompt": prompt_ids[:5], "max_tokens": 8, "logprobs": 1, "stream": True},
             10, read="stream"),
        Kind("full_vocab", {"prompt": prompt_ids, "max_tokens": 1, "prompt_logprobs": -1}, 5,
             read="full_vocab"),
    ]


@dataclass(frozen=True)
class Position:
    """One position of an answer: its token's id and log-probability (None where not scored),
    and the entries listed there ({token: log-probability}: the top k by text, the whole
    distribution by id; None where none are)."""

    token: int
    logprob: float | None
    entries: dict[str, float] | None


def completion_positions(payload: dict) -> list[Position]:
    """A completion's positions, all choices in order; ValueError when its lists differ in
    length."""
    positions = []
    for choice in payload["choices"]:
        logprobs = choice["logprobs"]
        columns = (logprobs["tokens"], logprobs["token_ids"], logprobs["token_logprobs"],
                   logprobs["top_logprobs"])
        positions += [Position(token, logprob, top)
                      for _, token, logprob, top in zip(*columns, strict=True)]
    return positions


def stream_positions(body: bytes) -> list[Position]:
    """The positions of a whole event stream; `Mismatch` without `[DONE]`."""
    events = [line[6:] for line in body.split(b"\n") if line.startswith(b"data: ")]
    if not events or events[-1] != b"[DONE]":
        raise Mismatch("the stream ended without [DONE]")
    positions = []
    for payload in map(orjson.loads, events[:-1]):
        if "error" in payload:
            raise Refused(payload["error"]["code"])
        positions += completion_positions(payload)
    return positions


def full_vocab_positions(compressed: bytes, prompt_ids: list[int]) -> list[Position]:
    """Each scored prompt position of a gzip body: the prompt's token there, its log-probability
    and the whole distribution; `Mismatch` when the gzip stream is not whole."""
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
    text = inflate.decompress(compressed)
    if not inflate.eof or inflate.unused_data:
        raise Mismatch("the gzip stream is not whole")
    first, *rows = orjson.loads(text)["choices"][0]["prompt_logprobs"]
    if first is not None:
        raise Mismatch("the first prompt position is scored")
    return [Position(token, row[str(token)]["logprob"], {t: e["logprob"] for t, e in row.items()})
            for token, row in zip(prompt_ids[1:], rows, strict=True)]


def close(expected: float | None, got: float | None) -> bool:
    if expected is None or got is None:
        return expected is got
    return math.isclose(expected, got, rel_tol=0, abs_tol=TOLERANCE)


def same_entries(expected: dict[str, float] | None, got: dict[str, float] | None) -> bool:
    """The same tokens, each with its value within TOLERANCE (in arrays: a whole distribution
    is tens of thousands of entries)."""
    if expected is None or got is None:
        return expected is got
    if expected.keys() != got.keys():
        return False
    values = np.fromiter(expected.values(), float, len(expected))
    others = np.fromiter(map(got.__getitem__, expected), float, len(expected))
    return bool(np.all(np.abs(values - others) <= TOLERANCE))


def same_positions(expected: list[Position], got: list[Position]) -> bool:
    return len(got) == len(expected) and all(
        e.token == g.token and close(e.logprob, g.logprob) and same_entries(e.entries, g.entries)
        for e, g in zip(expected, got, strict=True))


def error_code(content: bytes) -> str | None:
    """The envelope's error code of an error response, None when it has none."""
    try:
        return str(orjson.loads(content)["error"]["code"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None


@dataclass
class Record:
    kind: str
    tenant: str
    sent: float  # seconds since the load started
    ended: float | None = None
    outcome: str | None = None
    detail: str = ""


@dataclass
class SteadyLoad:
    """Requests of `kinds` at `rate` per second, each tenant's key in turn (None: no key)."""

    url: str
    model: str
    kinds: list[Kind]
    rate: float
    keys: dict[str, str | None] = field(default_factory=lambda: {"anonymous": None})
    timeout_s: float = 60
    seed: int = 0
    records: list[Record] = field(default_factory=list)  # one a request sent
    expected: dict[str, list[Position]] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    transport: httpx.AsyncBaseTransport | None = None  # None: the network's

    def now(self) -> float:
        return time.monotonic() - self.started

    def body(self, kind: Kind) -> dict:
        return {"model": self.model, "temperature": 0, **kind.body}

    async def positions(self, client: httpx.AsyncClient, kind: Kind, key: str | None) -> list[Position]:
        """The request's answer; `Refused` for an enveloped error, `Bare` for another."""
        headers = {"accept-encoding": "gzip" if kind.read == "full_vocab" else "identity"}
        if key:
            headers["authorization"] = f"Bearer {key}"
        async with client.stream("POST", "/v1/completions", json=self.body(kind),
                                 headers=headers) as response:
            content = b"".join([chunk async for chunk in response.aiter_raw()])
        if response.status_code != 200:
            code = error_code(content)
            raise Refused(code) if code else Bare(f"{response.status_code} {content[:60]!r}")
        if kind.read == "stream":
            return stream_positions(content)
        if kind.read == "full_vocab":
            return full_vocab_positions(content, kind.body["prompt"])
        return completion_positions(orjson.loads(content))

    async def learn(self, client: httpx.AsyncClient) -> None:
        """Each kind's answer, before anything is killed: what every later answer must equal."""
        key = next(iter(self.keys.values()))
        self.expected = {kind.name: await self.positions(client, kind, key) for kind in self.kinds}

    async def one(self, client: httpx.AsyncClient, kind: Kind, record: Record) -> None:
        """Sends `record`'s request and judges what came back: every ending, expected or not,
        gives it an outcome."""
        try:
            got = await asyncio.wait_for(self.positions(client, kind, self.keys[record.tenant]),
                                         self.timeout_s)
            record.outcome = "answered" if same_positions(self.expected[kind.name], got) else "wrong"
        except Refused as refusal:
            record.outcome, record.detail = "refused", str(refusal)
        except httpx.ConnectError as error:
            record.outcome, record.detail = "refused", f"connection refused: {error}"
        except Bare as bare:
            record.outcome, record.detail = "bare", str(bare)
        except (TimeoutError, httpx.TimeoutException):
            record.outcome, record.detail = "lost", f"no answer in {self.timeout_s:.0f} s"
        except httpx.TransportError as error:
            record.outcome, record.detail = "broken", type(error).__name__
        except Exception as error:  # a 200 that does not read as the answer
            record.outcome, record.detail = "wrong", f"{type(error).__name__}: {error}"
        record.ended = self.now()

    async def run(self, stop: asyncio.Event) -> None:
        """Sends until `stop`, then waits for every request sent."""
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(base_url=self.url, timeout=self.timeout_s, limits=limits,
                                     transport=self.transport) as client:
            if not self.expected:
                await self.learn(client)
            self.started = time.monotonic()
            chooser = random.Random(self.seed)
            tenants = itertools.cycle(self.keys)
            sending = []
            for tick in itertools.count():
                if stop.is_set():
                    break
                kind = chooser.choices(self.kinds, weights=[k.weight for k in self.kinds])[0]
                record = Record(kind.name, next(tenants), self.now())
                self.records.append(record)  # counted as sent before it leaves
                sending.append(asyncio.create_task(self.one(client, kind, record)))
                # A fixed schedule: the next request leaves on time whatever the answers do.
                await asyncio.sleep(max(0.0, (tick + 1) / self.rate - self.now()))
            await asyncio.gather(*sending)

    def recovered_since(self, moment: float, settle: int) -> bool:
        """Whether the last `settle` requests sent after `moment`, of those finished in order
        of sending, were all answered."""
        finished = list(itertools.takewhile(lambda r: r.outcome is not None,
                                            (r for r in self.records if r.sent >= moment)))
        return len(finished) >= settle and all(r.outcome == "answered" for r in finished[-settle:])


@dataclass
class Phase:
    """What became of the requests that ended between one kill and the next."""

    name: str
    start: float
    outcomes: Counter
    details: Counter
    time_to_full_service: float  # from the kill to the end of the last failed request
    slowest_answer: float  # seconds: an answer may wait for a replacement instead of failing

    def row(self) -> str:
        counts = " | ".join(str(self.outcomes[outcome]) for outcome in OUTCOMES)
        return (f"| {self.name} | {sum(self.outcomes.values())} | {counts} | "
                f"{self.time_to_full_service:.1f} s | {self.slowest_answer:.1f} s |")


def phases(records: list[Record], kills: list[tuple[str, float]]) -> list[Phase]:
    """One phase before the first kill ("steady") and one from each kill to the next; a
    request belongs to the phase it ended in (one in flight at a kill is the kill's).
    `Unjudged` unless the phases' outcomes add up to the requests sent."""
    starts = [("steady", 0.0), *kills]
    result = []
    for (name, start), (_, end) in zip(starts, [*starts[1:], ("end", math.inf)], strict=True):
        ended = [r for r in records if r.ended is not None and start <= r.ended < end]
        failed = [r for r in ended if r.outcome in FAILED]
        result.append(Phase(name, start, Counter(r.outcome for r in ended),
                            Counter(f"{r.outcome}: {r.kind}: {r.detail}" for r in failed),
                            max((r.ended - start for r in failed), default=0.0),
                            max((r.ended - r.sent for r in ended if r.outcome == "answered"), default=0.0)))
    counted = sum(sum(phase.outcomes.values()) for phase in result)
    if counted != len(records):
        raise Unjudged(f"the phases count {counted} outcomes of the {len(records)} requests sent")
    return result


def table(phases_: list[Phase]) -> str:
    header = "| killed | requests | " + " | ".join(OUTCOMES) + " | time to full service | slowest answer |"
    return "\n".join([header, "|" + " --- |" * (len(OUTCOMES) + 4), *(p.row() for p in phases_)])


def processes(marker: str) -> list[psutil.Process]:
    """This machine's processes whose command line holds `marker`."""
    return [process for process in psutil.process_iter(["cmdline"])
            if marker in " ".join(process.info["cmdline"] or [])]


def kill_one(marker: str) -> None:
    """SIGKILL to one process whose command line holds `marker`."""
    victims = processes(marker)
    if not victims:
        raise LookupError(f"no process with {marker!r} in its command line")
    victims[0].kill()


async def under_chaos(load: SteadyLoad, kills: list[tuple[str, Callable[[], None]]],
                      steady_s: float, settle: int, limit_s: float,
                      after_kill: Callable[[str], None] = lambda name: None) -> list[Phase]:
    """Runs `load`, kills each target in turn once the service has recovered from the last
    (at most `limit_s` after it), and returns the phases."""
    stop = asyncio.Event()
    running = asyncio.create_task(load.run(stop))

    async def pause(seconds: float) -> None:
        """Sleeps, raising the load's error if it stopped."""
        await asyncio.wait([running], timeout=seconds)
        if running.done():
            running.result()
            raise RuntimeError("the load stopped by itself")

    learnt_by = time.monotonic() + len(load.kinds) * load.timeout_s
    while not load.expected:
        if time.monotonic() > learnt_by:
            running.cancel()
            raise TimeoutError("the load did not learn its answers")
        await pause(0.1)
    await pause(steady_s)
    moments = []
    for name, kill in kills:
        killed_at = load.now()
        moments.append((name, killed_at))
        await asyncio.to_thread(kill)
        await asyncio.to_thread(after_kill, name)
        while not load.recovered_since(killed_at, settle) and load.now() - killed_at < limit_s:
            await pause(0.5)
        print(f"{name} killed at {killed_at:.1f} s; {settle} answered in a row "
              f"{load.now() - killed_at:.1f} s later", flush=True)
    stop.set()
    await running
    return phases(load.records, moments)


def main() -> None:
    parser = argparse.ArgumentParser(description="A steady mixed load; prints what became of each request.")
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--rate", type=float, default=4, help="requests per second")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--prompt-ids", type=int, nargs="+", default=list(range(1000, 1016)))
    parser.add_argument("--key", action="append", default=[], help="a tenant's API key (repeat for more)")
    options = parser.parse_args()
    keys = {f"tenant {i + 1}": key for i, key in enumerate(options.key)} or {"anonymous": None}
    load = SteadyLoad(options.url, options.model, standard_kinds(options.prompt_ids), options.rate, keys)

    async def for_a_while() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(options.seconds, stop.set)
        await load.run(stop)
    asyncio.run(for_a_while())
    print(table(phases(load.records, [])))


if __name__ == "__main__":
    main()
