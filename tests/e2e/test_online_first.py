"""Online requests first: batch work (BatchConfig.priority) queued in a model replica ahead
of an online request does not hold it back, and batch lines and dataset documents reach the
engine at the batch's priority (test_batch.py, test_dataset_scoring.py)."""

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from ray import serve

from serve_app.config import BatchConfig, ModelConfig
from serve_app.engine.wire import ONLINE, EngineRequest
from serve_app.ops.app import model_deployment_name
from serve_app.ops.local_ray import APP_NAME
from serve_app.store.model_store import TINY_BOS
from tests.e2e.conftest import BACKGROUND_QUIET_S, KV_BLOCKS, MAX_MODEL_LEN, MODEL
from tests.e2e.waiting import poll_until

pytestmark = pytest.mark.e2e

BACKGROUND = BatchConfig().priority
QUEUED = 32  # background requests sent before the online one
IN_ENGINE = ModelConfig(name=MODEL).max_background_in_engine
NO_END = dict.fromkeys([0, 1, 2, 4], -100.0)  # the tiny models' special tokens: all max_tokens generated
WAIT_S = 60


def replica(model: str = MODEL):
    return serve.get_deployment_handle(model_deployment_name(model), app_name=APP_NAME)


def requests_by_priority(model: str = MODEL) -> dict[int, int]:
    """Engine requests the model's replica has received at each priority."""
    return replica(model).requests_by_priority.remote().result()


def scoring(priority: int, first: int, length: int) -> EngineRequest:
    """A prompt scored whole, as a batch's echo lines are; each its own first token, so that
    none waits for another's prefix or reads it from a cache."""
    return EngineRequest(prompt_token_ids=list(range(first, first + length)), max_tokens=1, temperature=0.0,
                         top_p=1.0, logprobs=1, prompt_logprobs=1, tenant="online", priority=priority,
                         sent_at=time.time())


def test_an_online_request_passes_the_background_work_queued_before_it(base_url):
    """Without priorities the engine takes the 32 long prompts first, in arrival order, and
    the online request ends with the last of them; with them, it waits for at most the few
    the replica lets into its engine and the step they are in."""
    handle = replica()
    background = [handle.generate.remote(scoring(BACKGROUND, 5 + i, MAX_MODEL_LEN - 100))
                  for i in range(QUEUED)]
    online = handle.generate.remote(scoring(ONLINE, 1000, 8))
    with ThreadPoolExecutor(QUEUED + 1) as threads:
        ended = list(threads.map(lambda response: (response.result(), time.monotonic())[1],
                                 [online, *background]))
    online_ended, after_online = ended[0], sum(end > ended[0] for end in ended[1:])
    assert after_online >= QUEUED - 3 * IN_ENGINE, (after_online, online_ended)


def test_a_background_prompt_computed_a_window_at_a_time_has_the_online_rows(base_url):
    """The background request's prompt is computed one KV block at a time (the session's
    `background_window`), each window reading the ones before it from the KV cache."""
    handle, request = replica(), scoring(ONLINE, 2000, MAX_MODEL_LEN - 100)
    before = requests_by_priority()
    # Tenants of their own: neither reads the other's rows from a prefix cache.
    online = handle.generate.remote(dataclasses.replace(request, tenant="online")).result()
    background = handle.generate.remote(dataclasses.replace(request, tenant="batch",
                                                            priority=BACKGROUND)).result()
    windows = -(-(len(request.prompt_token_ids) - 1) // KV_BLOCKS[MODEL])
    assert requests_by_priority()[BACKGROUND] - before.get(BACKGROUND, 0) == windows > 1
    assert_same_answer(background, online)


def test_a_background_prompt_goes_whole_once_online_requests_have_paused(base_url):
    """A model whose last online request left more than its `background_quiet_s` ago takes a
    background prompt of several windows as one engine request."""
    model, request = TINY_BOS, scoring(ONLINE, 3000, MAX_MODEL_LEN - 100)
    assert len(request.prompt_token_ids) > 2 * KV_BLOCKS[model]
    online = replica(model).generate.remote(dataclasses.replace(request, tenant="online")).result()
    poll_until(lambda: replica(model).background_quiet.remote().result(), WAIT_S,
               f"no online request in the engine for background_quiet_s ({BACKGROUND_QUIET_S} s)")
    before = requests_by_priority(model)
    # Sent now: this model refuses a request that waited more than a second (max_queue_wait_s).
    background = replica(model).generate.remote(dataclasses.replace(
        request, tenant="batch", priority=BACKGROUND, sent_at=time.time())).result()
    assert requests_by_priority(model)[BACKGROUND] - before.get(BACKGROUND, 0) == 1
    assert_same_answer(background, online)


def test_an_online_request_does_not_wait_for_a_batch_line_with_its_prompt(base_url):
    """A batch line holds its prompt as in flight while it waits for the engine, which a long
    online request keeps busy; an online request for the same prompt (an evaluation set scored
    online and as a batch at once) is computed at once, not after the batch line."""
    handle = replica()
    busy = EngineRequest(prompt_token_ids=[5, 6, 7], max_tokens=480, temperature=0.0, top_p=1.0,
                         logit_bias=NO_END, tenant="online", priority=ONLINE, sent_at=time.time())
    line = dataclasses.replace(scoring(BACKGROUND, 2500, MAX_MODEL_LEN - 100), tenant="eval")
    with ThreadPoolExecutor(3) as threads:
        def ended(request: EngineRequest):
            return threads.submit(result_and_end, handle.generate.remote(request))

        busy_ended = ended(busy)
        # In the engine: the batch line below waits for it to end.
        poll_until(lambda: handle.unfinished_requests.remote().result() == 1, WAIT_S, "the busy request")
        line_ended = ended(dataclasses.replace(line, sent_at=time.time()))
        # Held back, its prompt held as in flight.
        poll_until(lambda: handle.background_waiting.remote().result() == 1, WAIT_S, "the line held back")
        online_ended = ended(dataclasses.replace(line, priority=ONLINE, sent_at=time.time()))
        (online, online_at), (_, busy_at), (background, line_at) = (
            future.result() for future in (online_ended, busy_ended, line_ended))
    assert online_at < busy_at < line_at
    assert_same_answer(background, online)


def result_and_end(response) -> tuple:
    return response.result(), time.monotonic()


def assert_same_answer(background, online) -> None:
    """The same prompt rows (logprobs within 1e-4) and the same completion."""
    rows, expected = background.prompt_logprobs, online.prompt_logprobs
    for name in ("offsets", "token_ids", "ranks"):
        assert np.array_equal(getattr(rows, name), getattr(expected, name)), name
    assert np.allclose(rows.logprobs, expected.logprobs, atol=1e-4)
    (completion,), (expected_completion,) = background.completions, online.completions
    assert np.array_equal(completion.token_ids, expected_completion.token_ids)


def test_the_api_s_own_requests_reach_the_engine_as_online_ones(http):
    before = requests_by_priority()
    body = {"model": MODEL, "prompt": "online", "max_tokens": 1, "temperature": 0}
    assert http.post("/v1/completions", json=body).status_code == 200
    after = requests_by_priority()
    assert after[ONLINE] == before.get(ONLINE, 0) + 1
    assert after.get(BACKGROUND, 0) == before.get(BACKGROUND, 0)
