"""The chaos load's judgement of each request (serve_app.ops.chaos), on bodies built here and
served by httpx's MockTransport."""

import asyncio
import gzip
import itertools
from collections import Counter

import httpx
import orjson
import pytest

from serve_app.ops.chaos import (
    Kind,
    Mismatch,
    Position,
    Record,
    Refused,
    SteadyLoad,
    Unjudged,
    completion_positions,
    error_code,
    full_vocab_positions,
    phases,
    same_positions,
    standard_kinds,
    stream_positions,
    table,
)

SMALL = Kind("small", {"prompt": [1, 2], "max_tokens": 1, "logprobs": 2}, 1)
FULL_VOCAB = Kind("full_vocab", {"prompt": [1, 9, 7], "max_tokens": 1, "prompt_logprobs": -1}, 1,
                  read="full_vocab")


def completion(token_ids, logprobs, tops) -> dict:
    return {"choices": [{"logprobs": {"tokens": [f"t{t}" for t in token_ids], "token_ids": token_ids,
                                      "token_logprobs": logprobs, "top_logprobs": tops}}]}


ANSWER = completion([5, 6], [-0.5, -1.5], [{"a": -0.5, "b": -2.0}, {"a": -1.5, "c": -0.25}])
ANSWER_POSITIONS = [Position(5, -0.5, {"a": -0.5, "b": -2.0}), Position(6, -1.5, {"a": -1.5, "c": -0.25})]


def sse(*payloads, done=True) -> bytes:
    events = [b"data: " + orjson.dumps(p) + b"\n\n" for p in payloads]
    return b"".join(events) + (b"data: [DONE]\n\n" if done else b"")


def test_a_completion_binds_each_value_to_its_token_and_its_lists_must_be_as_long():
    assert same_positions(ANSWER_POSITIONS, completion_positions(ANSWER))
    short = orjson.loads(orjson.dumps(ANSWER))
    short["choices"][0]["logprobs"]["top_logprobs"].pop()
    with pytest.raises(ValueError):
        completion_positions(short)


def test_a_stream_is_whole_only_with_done_and_its_positions_add_up():
    first, second = (completion([t], [lp], [top]) for t, lp, top in
                     zip([5, 6], [-0.5, -1.5], ANSWER["choices"][0]["logprobs"]["top_logprobs"], strict=True))
    body = sse(first, second)
    assert stream_positions(body) == ANSWER_POSITIONS
    with pytest.raises(Mismatch):
        stream_positions(body[:-len(b"data: [DONE]\n\n")])
    with pytest.raises(Refused, match="not_ready"):
        stream_positions(sse(first, {"error": {"code": "not_ready", "message": "m"}}))


def full_vocab_body(rows) -> bytes:
    return gzip.compress(orjson.dumps({"choices": [{"prompt_logprobs": rows}]}))


ROWS = [None, {"7": {"logprob": -0.1}, "9": {"logprob": -3.0}},
        {"7": {"logprob": -2.0}, "9": {"logprob": -0.2}}]


def test_a_full_vocabulary_body_gives_each_prompt_tokens_distribution_and_must_be_whole():
    body = full_vocab_body(ROWS)
    assert full_vocab_positions(body, [1, 9, 7]) == [Position(9, -3.0, {"7": -0.1, "9": -3.0}),
                                                      Position(7, -2.0, {"7": -2.0, "9": -0.2})]
    with pytest.raises(Mismatch):
        full_vocab_positions(body[:-4], [1, 9, 7])
    with pytest.raises(ValueError):  # a row more or fewer than the prompt's
        full_vocab_positions(body, [1, 9, 7, 7])


def moved(position: Position, **fields) -> list[Position]:
    """ANSWER_POSITIONS with `position` replaced by one with other `fields`."""
    changed = Position(**{**vars(position), **fields})
    return [changed if p is position else p for p in ANSWER_POSITIONS]


@pytest.mark.parametrize(("got", "same"), [
    (moved(ANSWER_POSITIONS[1], logprob=-1.5 + 2e-5), True),  # float32 rounding between batches
    (moved(ANSWER_POSITIONS[1], entries={"a": -1.5, "c": -0.25 - 2e-5}), True),
    (moved(ANSWER_POSITIONS[1], logprob=-1.5 + 2e-4), False),
    (moved(ANSWER_POSITIONS[1], entries={"a": -1.5, "c": -0.25 - 2e-4}), False),
    (moved(ANSWER_POSITIONS[1], entries={"a": -0.25, "c": -1.5}), False),  # values swapped
    (moved(ANSWER_POSITIONS[1], entries={"a": -1.5, "d": -0.25}), False),  # to another token
    (moved(ANSWER_POSITIONS[1], entries={"a": -1.5}), False),
    (moved(ANSWER_POSITIONS[1], entries=None), False),
    (moved(ANSWER_POSITIONS[1], token=7), False),
    (moved(ANSWER_POSITIONS[0], logprob=None), False),
    (ANSWER_POSITIONS[:1], False),
])
def test_answers_match_within_rounding_value_by_token_and_nothing_else(got, same):
    assert same_positions(ANSWER_POSITIONS, got) is same


def test_an_error_code_comes_only_from_the_envelope():
    assert error_code(b'{"error": {"code": "overloaded", "message": "m"}}') == "overloaded"
    assert error_code(b"Internal Server Error") is None
    assert error_code(b'{"detail": "x"}') is None


def served(endings) -> httpx.MockTransport:
    """A transport that ends each request with the next of `endings`, in turn: a (status, body)
    to answer, streamed as a server's is, or an exception to raise."""
    turns = itertools.cycle(endings)

    def answer(request: httpx.Request) -> httpx.Response:
        ending = next(turns)
        if isinstance(ending, Exception):
            raise ending
        status, body = ending
        return httpx.Response(status, stream=httpx.ByteStream(body))
    return httpx.MockTransport(answer)


def judged(kind: Kind, expected: list[Position], ending) -> Record:
    load = SteadyLoad("http://chaos", "m", [kind], rate=1, expected={kind.name: expected})
    record = Record(kind.name, "anonymous", 0.0)

    async def send() -> None:
        async with httpx.AsyncClient(base_url=load.url, transport=served([ending])) as client:
            await load.one(client, kind, record)
    asyncio.run(send())
    return record


def with_value_moved() -> dict:
    """ANSWER with the second position's top entries' values moved to each other's tokens."""
    answer = orjson.loads(orjson.dumps(ANSWER))
    answer["choices"][0]["logprobs"]["top_logprobs"][1] = {"a": -0.25, "c": -1.5}
    return answer


def without_logprobs() -> dict:
    answer = orjson.loads(orjson.dumps(ANSWER))
    del answer["choices"][0]["logprobs"]["token_logprobs"]
    return answer


@pytest.mark.parametrize(("kind", "ending", "outcome"), [
    (SMALL, (200, orjson.dumps(ANSWER)), "answered"),
    (SMALL, (200, orjson.dumps(ANSWER)[:-9]), "wrong"),  # does not parse
    (SMALL, (200, orjson.dumps(without_logprobs())), "wrong"),  # a KeyError
    (SMALL, (200, orjson.dumps(with_value_moved())), "wrong"),
    (SMALL, (200, b"<html>ok</html>"), "wrong"),
    (FULL_VOCAB, (200, full_vocab_body(ROWS)), "answered"),
    (FULL_VOCAB, (200, full_vocab_body(ROWS)[:-4]), "wrong"),  # truncated gzip
    (FULL_VOCAB, (200, b"\x1f\x8b\x08\x00 not gzip"), "wrong"),
    (SMALL, (503, orjson.dumps({"error": {"code": "not_ready", "message": "m"}})), "refused"),
    (SMALL, (404, b"Path not found"), "bare"),
    (SMALL, httpx.ConnectError("refused"), "refused"),
    (SMALL, httpx.ReadError("cut"), "broken"),
    (SMALL, httpx.ReadTimeout("slow"), "lost"),
])
def test_every_ending_of_a_request_is_judged_and_any_unexpected_one_is_wrong(kind, ending, outcome):
    expected = full_vocab_positions(full_vocab_body(ROWS), kind.body["prompt"]) \
        if kind is FULL_VOCAB else ANSWER_POSITIONS
    record = judged(kind, expected, ending)
    assert record.outcome == outcome, record.detail
    assert record.ended is not None


def test_the_outcomes_of_a_run_add_up_to_the_requests_it_sent():
    endings = [((200, orjson.dumps(ANSWER)), "answered"),
               ((200, b"{"), "wrong"),
               ((200, orjson.dumps(without_logprobs())), "wrong"),
               ((503, orjson.dumps({"error": {"code": "overloaded", "message": "m"}})), "refused"),
               (httpx.ReadError("cut"), "broken")]
    load = SteadyLoad("http://chaos", "m", [SMALL], rate=500, expected={"small": ANSWER_POSITIONS},
                      transport=served([ending for ending, _ in endings]))

    async def briefly() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.2, stop.set)
        await load.run(stop)
    asyncio.run(briefly())
    sent = len(load.records)
    (steady,) = phases(load.records, [])
    assert sent >= len(endings) and sum(steady.outcomes.values()) == sent
    expected = Counter(outcome for _, (_, outcome) in zip(range(sent), itertools.cycle(endings)))
    assert steady.outcomes == expected


def records(*rows) -> list[Record]:
    return [Record("small", "anonymous", sent, sent + 0.1, outcome, detail) for sent, outcome, detail in rows]


def test_phases_split_at_each_kill_by_when_requests_ended():
    load = records((1, "answered", ""), (10.5, "refused", "not_ready"), (12, "broken", "ReadError"),
                   (13, "answered", ""), (20.2, "answered", ""), (21, "answered", ""))
    load.append(Record("stream", "anonymous", 9.5, 10.2, "broken", "RemoteProtocolError"))  # in flight
    load.append(Record("echo", "anonymous", 19.0, 19.5, "answered"))
    steady, ingress, controller = phases(load, [("ingress", 10.0), ("controller", 20.0)])
    assert steady.outcomes == Counter(answered=1)
    assert ingress.outcomes == Counter(answered=2, refused=1, broken=2)
    assert ingress.time_to_full_service == pytest.approx(2.1)  # the last failure's end
    assert ingress.details == Counter({"refused: small: not_ready": 1, "broken: small: ReadError": 1,
                                       "broken: stream: RemoteProtocolError": 1})
    assert controller.outcomes == Counter(answered=2) and controller.time_to_full_service == 0
    row = table([steady, ingress, controller]).splitlines()[3]
    assert row == "| ingress | 5 | 2 | 1 | 2 | 0 | 0 | 0 | 2.1 s | 0.5 s |"  # the echo's answer


def test_phases_refuse_to_leave_a_request_sent_uncounted():
    sent = records((1, "answered", ""), (2, "wrong", "KeyError: 'logprobs'"))
    assert sum(sum(p.outcomes.values()) for p in phases(sent, [("ingress", 1.5)])) == len(sent)
    sent.append(Record("small", "anonymous", 3))  # never judged
    with pytest.raises(Unjudged, match="2 outcomes of the 3 requests sent"):
        phases(sent, [("ingress", 1.5)])


def test_recovery_needs_the_last_requests_in_order_answered():
    load = SteadyLoad("http://x", "m", standard_kinds(list(range(16))), rate=4)
    load.records = records((1, "refused", ""), (2, "answered", ""), (3, "answered", ""))
    assert load.recovered_since(0, 2) and not load.recovered_since(0, 3)
    load.records.append(Record("small", "anonymous", 4))  # still running: the ones after wait
    load.records += records((5, "answered", ""))
    assert load.recovered_since(2, 2) and not load.recovered_since(2.5, 2)
