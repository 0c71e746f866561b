"""Two answers to the same request (a batch line's and the online one's, a request's alone and
among others) compared value by value, each bound to its token, within float32 noise: batching
changes float rounding."""

from tests.e2e.reference import TOLERANCE


def assert_close(got: float | None, expected: float | None, where) -> None:
    assert (got is None) == (expected is None), where
    assert expected is None or abs(got - expected) <= TOLERANCE, (where, got, expected)


def assert_same_top(got: dict | None, expected: dict | None) -> None:
    """One position's `top_logprobs` ({token: logprob}): every token with its own value. A
    token may be in one answer alone only where it ties within TOLERANCE with one of the
    other's: at the top k's edge, rounding may swap the two."""
    assert (got is None) == (expected is None), (got, expected)
    for token in (got or {}).keys() | (expected or {}).keys():
        if token in got and token in expected:
            assert_close(got[token], expected[token], (token, got, expected))
        else:
            alone, other = (got[token], expected) if token in got else (expected[token], got)
            assert any(abs(alone - value) <= TOLERANCE for value in other.values()), (token, got, expected)


def assert_same_choice(got: dict, expected: dict) -> None:
    """A /v1/completions choice, its index aside: text, finish_reason, and in `logprobs`
    every token with its offset, logprob and top_logprobs."""
    assert (got["text"], got["finish_reason"]) == (expected["text"], expected["finish_reason"])
    mine, theirs = got["logprobs"], expected["logprobs"]
    assert (mine is None) == (theirs is None)
    if theirs is None:
        return
    for name in ("tokens", "token_ids", "text_offset"):
        assert mine[name] == theirs[name], name
    for position, (value, other) in enumerate(zip(mine["token_logprobs"], theirs["token_logprobs"],
                                                  strict=True)):
        assert_close(value, other, position)
    assert (mine["top_logprobs"] is None) == (theirs["top_logprobs"] is None)
    for top, other in zip(mine["top_logprobs"] or [], theirs["top_logprobs"] or [], strict=True):
        assert_same_top(top, other)


def assert_same_choices(got: dict, expected: dict) -> None:
    """Two /v1/completions bodies: the same choices, in order."""
    for mine, theirs in zip(got["choices"], expected["choices"], strict=True):
        assert mine["index"] == theirs["index"]
        assert_same_choice(mine, theirs)
