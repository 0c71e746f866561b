"""The chaos load's judgement of each request (probserve.ops.chaos), on bodies built here."""

import gzip
from collections import Counter

import orjson
import pytest

from probserve.ops.chaos import (
    CutShort,
    Mismatch,
    Record,
    Refused,
    SteadyLoad,
    error_code,
    full_vocab_numbers,
    phases,
    same_numbers,
    standard_kinds,
    stream_numbers,
    table,
)


def completion(tokens, logprobs) -> dict:
    return {"choices": [{"logprobs": {"tokens": tokens, "token_logprobs": logprobs}}]}


def sse(*payloads, done=True) -> bytes:
    events = [b"data: " + orjson.dumps(p) + b"\n\n" for p in payloads]
    return b"".join(events) + (b"data: [DONE]\n\n" if done else b"")


def test_a_stream_is_whole_only_with_done_and_its_tokens_add_up():
    body = sse(completion(["a"], [-0.5]), completion(["b"], [-1.5]))
    assert stream_numbers(body) == (["a", "b"], [-0.5, -1.5])
    with pytest.raises(CutShort):
        stream_numbers(body[:-len(b"data: [DONE]\n\n")])
    with pytest.raises(Refused, match="not_ready"):
        stream_numbers(sse(completion(["a"], [-0.5]), {"error": {"code": "not_ready", "message": "m"}}))


def full_vocab_body(rows) -> bytes:
    return gzip.compress(orjson.dumps({"choices": [{"prompt_logprobs": rows}]}))


def test_a_full_vocabulary_body_gives_each_prompt_tokens_logprob_and_must_be_whole():
    rows = [None, {"7": {"logprob": -0.1}, "9": {"logprob": -3.0}},
            {"7": {"logprob": -2.0}, "9": {"logprob": -0.2}}]
    body = full_vocab_body(rows)
    assert full_vocab_numbers(body, [1, 9, 7]) == ([2, 2], [-3.0, -2.0])
    with pytest.raises(CutShort):
        full_vocab_numbers(body[:-4], [1, 9, 7])
    with pytest.raises(Mismatch):
        full_vocab_numbers(body, [1, 9, 7, 7])


def test_numbers_match_within_rounding_and_nothing_else():
    expected = (["a", "b"], [None, -1.0])
    assert same_numbers(expected, (["a", "b"], [None, -1.0 + 1e-5]))
    assert not same_numbers(expected, (["a", "b"], [None, -1.1]))
    assert not same_numbers(expected, (["a", "c"], [None, -1.0]))
    assert not same_numbers(expected, (["a", "b"], [-1.0, -1.0]))
    assert not same_numbers(expected, (["a", "b"], [None]))


def test_an_error_code_comes_only_from_the_envelope():
    assert error_code(b'{"error": {"code": "overloaded", "message": "m"}}') == "overloaded"
    assert error_code(b"Internal Server Error") is None
    assert error_code(b'{"detail": "x"}') is None


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


def test_recovery_needs_the_last_requests_in_order_answered():
    load = SteadyLoad("http://x", "m", standard_kinds(list(range(16))), rate=4)
    load.records = records((1, "refused", ""), (2, "answered", ""), (3, "answered", ""))
    assert load.recovered_since(0, 2) and not load.recovered_since(0, 3)
    load.records.append(Record("small", "anonymous", 4))  # still running: the ones after wait
    load.records += records((5, "answered", ""))
    assert load.recovered_since(2, 2) and not load.recovered_since(2.5, 2)
