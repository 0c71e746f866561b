"""Requests that share a prefix with one being computed wait for it; the others do not."""

import asyncio

from serve_app.engine.shared_prefix import InFlightPrefixes, block_keys

BLOCK = 4
CONTEXT = list(range(100, 112))  # three blocks


def keys(token_ids: list[int]) -> list[int]:
    return block_keys(token_ids, BLOCK, len(token_ids))


def test_a_prefix_key_stands_for_everything_before_it():
    assert keys([1, 2, 3, 4, 5, 6, 7, 8])[0] == keys([1, 2, 3, 4, 9, 9, 9, 9])[0]
    assert keys([1, 2, 3, 4, 5, 6, 7, 8])[1] != keys([0, 2, 3, 4, 5, 6, 7, 8])[1]
    assert len(block_keys(list(range(11)), BLOCK, 11)) == 2 and block_keys([1, 2], BLOCK, 2) == []


def run(prompts: list[tuple[list[int], int]], leads: bool = True, background: frozenset[int] = frozenset(),
        release_order: list[int] | None = None) -> list[str]:
    """Starts each request in order while the earlier ones still compute (those of `background`
    as batch work), then lets them end in `release_order` (by default the same); returns the
    order in which they reached the engine and finished."""
    prefixes, events = InFlightPrefixes(BLOCK), []

    async def request(index: int, token_ids: list[int], readable: int, release: asyncio.Event):
        async with prefixes.turn(token_ids, readable, leads, background=index in background):
            events.append(f"{index} computes")
            await release.wait()
        events.append(f"{index} done")

    async def main():
        releases = [asyncio.Event() for _ in prompts]
        tasks = []
        for index, (token_ids, readable) in enumerate(prompts):
            tasks.append(asyncio.create_task(request(index, token_ids, readable, releases[index])))
            await asyncio.sleep(0)
        for index in release_order or range(len(prompts)):
            await asyncio.sleep(0)
            releases[index].set()
        await asyncio.gather(*tasks)
        assert not prefixes.computing
    asyncio.run(main())
    return events


def test_choices_of_one_context_wait_for_the_first():
    events = run([(CONTEXT + [1], 12), (CONTEXT + [2], 12), (CONTEXT + [3, 4], 12)])
    assert events[:2] == ["0 computes", "0 done"]
    assert set(events[2:]) == {"1 computes", "2 computes", "1 done", "2 done"}


def test_no_wait_without_a_shared_prefix_or_where_the_cache_may_not_be_read():
    events = run([(CONTEXT + [1], 12), (list(range(13)), 12), (CONTEXT + [2], 0)])
    assert events[:3] == ["0 computes", "1 computes", "2 computes"]


def test_no_wait_for_a_prefix_that_is_a_small_part_of_the_prompt():
    events = run([(CONTEXT[:4] + [1], 4), (CONTEXT[:4] + list(range(20)), 23)])
    assert events[:2] == ["0 computes", "1 computes"]


def test_no_wait_for_a_request_that_does_more_than_score():
    events = run([(CONTEXT + [1], 12), (CONTEXT + [2], 12)], leads=False)
    assert events[:2] == ["0 computes", "1 computes"]


def test_an_online_request_does_not_wait_for_a_background_one_with_its_prefix():
    """The batch line may wait long for the engine; the online request computes at once and
    ends first."""
    events = run([(CONTEXT + [1], 12), (CONTEXT + [2], 12)], background=frozenset({0}), release_order=[1, 0])
    assert events == ["0 computes", "1 computes", "1 done", "0 done"]


def test_an_online_request_takes_the_prefix_over_from_a_background_one():
    """The online requests after it wait for it, a batch line too; the background one's end
    leaves the online one's prefix in flight."""
    events = run([(CONTEXT + [1], 12), (CONTEXT + [2], 12), (CONTEXT + [3], 12), (CONTEXT + [4], 12)],
                 background=frozenset({0, 3}), release_order=[0, 1, 2, 3])
    assert events[:4] == ["0 computes", "1 computes", "0 done", "1 done"]
    assert set(events[4:]) == {"2 computes", "3 computes", "2 done", "3 done"}


def test_a_background_request_waits_for_an_online_one_with_its_prefix():
    events = run([(CONTEXT + [1], 12), (CONTEXT + [2], 12)], background=frozenset({1}))
    assert events == ["0 computes", "0 done", "1 computes", "1 done"]
