"""The prefix index of the models' router: a prompt's leading blocks named by chained keys in
its cache namespace, the replica sent the longest run of them chosen within the load bound, a
replica's entries bounded and gone with it (serve_app.front.prefix_affinity)."""

import pytest

from serve_app.front.prefix_affinity import MAX_KEYED_BLOCKS, PrefixIndex, ReplicaPrefixes, prefix_keys

BLOCK = 4
TENANT = "tenant:alpha"


def keys(tokens: list[int], namespace: str = TENANT) -> list[int]:
    return prefix_keys(tokens, BLOCK, namespace)


def context(seed: int, blocks: int = 3) -> list[int]:
    return [seed * 1000 + i for i in range(blocks * BLOCK)]


def index(load_factor: float = 1.5, load_slack: int = 4, capacity: int = 1000) -> PrefixIndex:
    return PrefixIndex(capacity, load_factor, load_slack)


def test_a_key_names_a_whole_leading_block_and_everything_before_it():
    prompt = context(1) + [7, 8]  # three whole blocks and a part of one
    assert len(keys(prompt)) == 3
    assert keys(prompt[:2 * BLOCK]) == keys(prompt)[:2]  # a prefix's keys begin its prompt's
    other_start = [99, *prompt[1:]]
    assert not set(keys(other_start)) & set(keys(prompt))  # one token apart: every key apart
    assert keys(prompt[:BLOCK - 1]) == []


def test_a_namespace_has_keys_of_its_own():
    prompt = context(1)
    assert not set(keys(prompt, "tenant:alpha")) & set(keys(prompt, "tenant:beta"))
    assert not set(keys(prompt, TENANT)) & set(keys(prompt, f"{TENANT}|adapter:a#r1#01"))


def test_a_long_prompt_is_keyed_up_to_the_bound():
    assert len(keys(list(range((MAX_KEYED_BLOCKS + 5) * BLOCK)))) == MAX_KEYED_BLOCKS


def test_the_replica_sent_a_prefix_is_chosen_for_the_requests_that_share_it():
    prefixes = index()
    shared = context(1)
    prefixes.sent("a", keys(shared + [1]))
    for choice in range(2, 6):
        assert prefixes.choose(keys(shared + [choice]), {"a": 0, "b": 0}) == "a"
    assert prefixes.choose(keys(context(2)), {"a": 0, "b": 0}) is None  # a new prefix: by load


def test_the_longest_match_wins_and_the_less_loaded_of_equals():
    prefixes = index(load_factor=10)
    prompt = context(1, blocks=4)
    prefixes.sent("short", keys(prompt[:BLOCK]))
    prefixes.sent("long", keys(prompt[:3 * BLOCK]))
    assert prefixes.choose(keys(prompt), {"short": 0, "long": 3}) == "long"
    prefixes.sent("short", keys(prompt[:3 * BLOCK]))
    assert prefixes.choose(keys(prompt), {"short": 2, "long": 3}) == "short"


@pytest.mark.parametrize(("load", "slack", "taken"),
                         [(5, 0, True), (6, 0, False), (13, 2, True), (14, 2, False)])
def test_a_replica_past_the_bound_takes_no_request_by_its_prefix(load, slack, taken):
    """Two replicas, the other with two requests in flight: the holder may hold 1.5 times the
    mean of the requests in flight once it has taken this one, and `slack` more."""
    prefixes = index(load_factor=1.5, load_slack=slack)
    prompt = context(1)
    prefixes.sent("a", keys(prompt))
    chosen = prefixes.choose(keys(prompt), {"a": load, "b": 2})
    assert chosen == ("a" if taken else None)


def test_a_replica_that_leaves_takes_only_its_own_prefixes():
    prefixes = index()
    held = {replica: context(seed) for seed, replica in enumerate(["a", "b", "c"])}
    for replica, prompt in held.items():
        prefixes.sent(replica, keys(prompt))
    prefixes.keep_only(["a", "c", "d"])  # b left, d joined
    assert set(prefixes.replicas) == {"a", "c"}
    loads = {"a": 0, "c": 0, "d": 0}
    assert [prefixes.choose(keys(held[r]), loads) for r in ("a", "b", "c")] == ["a", None, "c"]
    prefixes.sent("d", keys(held["b"]))  # b's prefix, sent again by load
    assert prefixes.choose(keys(held["b"]), loads) == "d"


def test_tenants_never_match_each_others_prefixes():
    prefixes = index()
    prompt = context(1)
    prefixes.sent("a", keys(prompt, "tenant:alpha"))
    assert prefixes.choose(keys(prompt, "tenant:beta"), {"a": 0, "b": 0}) is None


def test_a_replicas_entries_are_bounded_the_least_recently_sent_first_out():
    held = ReplicaPrefixes(capacity=2 * 3)
    first, second, third = context(1), context(2), context(3)
    held.add(keys(first))
    held.add(keys(second))
    held.add(keys(first))  # sent again: the most recent
    held.add(keys(third))
    assert len(held.keys) == 6
    assert [held.matched_blocks(keys(p)) for p in (first, second, third)] == [3, 0, 3]
