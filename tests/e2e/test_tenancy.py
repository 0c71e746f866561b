"""Tenants and keys over HTTP, on the tenancy application (tests/e2e/tenancy_app.py: two
ingress replicas that share one real Redis): every error, model visibility and
tighter caps, a request rate that holds across both replicas and resets, fair sharing under a
flood, usage read back, Redis going away, the viewer asking for a key and showing a tenant's
refusals, LoRA adapters loaded by a tenant and its alone (kept across a redeployment), and no
key or prompt in any log."""

import itertools
import threading
import time
import uuid
from collections.abc import Callable

import httpx
import numpy as np
import orjson
import pytest
from ray import serve
from selenium.webdriver.support.ui import Select

from serve_app.config import model_deployment_name
from serve_app.store.adapter_store import adapter_name, adapter_path
from serve_app.store.model_store import TINY, TINY_BOS
from serve_app.tenants import keyring
from serve_app.tenants.keyring import KeyFile
from tests.e2e.browser import Browser
from tests.e2e.reference import TOLERANCE
from tests.e2e.same_answer import assert_same_choice
from tests.e2e.tenancy_app import (
    APP,
    FLOOD_CLIENTS,
    FLOOD_MAX_IN_FLIGHT,
    INGRESS_REPLICAS,
    REQUESTS_PER_MINUTE,
    TUNER_ROOT,
    VIEWER_REQUESTS_PER_MINUTE,
    as_,
    deploy,
)
from tests.e2e.test_prefix_reuse import counted
from tests.e2e.test_request_log import session_logs
from tests.e2e.test_viewer import click_and_wait
from tests.e2e.waiting import poll_until, read_until

SECRET_WORD = f"tenant-secret-{uuid.uuid4().hex}"
# Metrics reach Prometheus through Ray's metrics agent (reports every 2 s) and a scrape (every
# 3 s), both slower on a loaded machine.
METRICS_WAIT_S = 90
# How long a test waits, at most, for what must come (usage counted once a response is over,
# a batch's progress): bounds against a hang, not timings.
USAGE_WAIT_S, BATCH_WAIT_S = 30, 240
# The fairness test: flood's clients, many more than its bound per ingress replica, and one
# request for every tenant there (the same work whoever sends it: only where it waits differs).
BETA_REQUESTS = 11
SAME_REQUEST = {"prompt": "the same request", "max_tokens": 8, "temperature": 0}
# The redeployed batch's lines, each compared with the same request online (another tenant's,
# whose caches hold none of the batch's prompts), so many prompts a request.
SCORING, ONLINE_PROMPTS = {"max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0}, 60
FLOOD_START_S, FLOOD_LIMIT_S = 60, 300  # every client answered once by then; stopped by then


@pytest.fixture(scope="module")
def url(tenancy_url) -> str:
    return tenancy_url


@pytest.fixture(scope="module")
def alpha_refusal() -> dict:
    """When alpha's rate was first refused, and the wait it was told (the rate tests)."""
    return {}


def complete(url, headers, model=TINY, **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", headers=headers, timeout=60,
                      json={"model": model, "prompt": f"{SECRET_WORD} counts", "max_tokens": 2, **body})


def test_keys_are_required_and_checked(url, keys):
    missing = complete(url, {})
    assert (missing.status_code, missing.json()["error"]["code"]) == (401, "missing_api_key")
    wrong = complete(url, {"authorization": "Bearer psk_0123456789ab_notakey"})
    assert (wrong.status_code, wrong.json()["error"]["code"]) == (401, "invalid_api_key")
    for path in ("/v1/models", "/v1/usage", "/tokenizer_info"):
        assert httpx.get(f"{url}{path}").status_code == 401
    assert httpx.post(f"{url}/tokenize", json={"model": TINY, "prompt": "a"}).status_code == 401
    assert httpx.get(f"{url}/health").status_code == 200 and httpx.get(f"{url}/livez").status_code == 200
    assert complete(url, as_(keys, "beta")).status_code == 200


def test_a_revoked_key_stops_working_without_a_restart(url, keys):
    assert complete(url, as_(keys, "gamma")).status_code == 200
    document = KeyFile.read(keys["key_file"])
    gamma = next(key.id for key in document.keys if key.tenant == "gamma")
    keyring.revoke_key(document, gamma).write(keys["key_file"])
    answer = read_until(lambda: complete(url, as_(keys, "gamma")), lambda a: a.status_code != 200, 30,
                        "the revoked key still works", pause_s=0.5)
    assert (answer.status_code, answer.json()["error"]["code"]) == (401, "invalid_api_key")


def test_a_tenant_sees_scores_and_learns_of_its_models_only(url, keys):
    alpha, beta = as_(keys, "alpha"), as_(keys, "beta")
    listed = httpx.get(f"{url}/v1/models", headers=alpha).json()["data"]
    assert [card["id"] for card in listed] == [TINY]
    assert listed[0]["capabilities"]["max_logprobs"] == 2  # the tenant's cap, below the model's 5
    beta_models = httpx.get(f"{url}/v1/models", headers=beta).json()["data"]
    assert {card["id"] for card in beta_models} == {TINY, TINY_BOS}
    hidden = complete(url, alpha, model=TINY_BOS)
    absent = complete(url, alpha, model="no-such-model")
    assert hidden.status_code == absent.status_code == 404
    assert hidden.json()["error"]["code"] == absent.json()["error"]["code"] == "model_not_found"
    assert hidden.json()["error"]["message"].replace(TINY_BOS, "X") == \
        absent.json()["error"]["message"].replace("no-such-model", "X")
    tokenized = httpx.post(f"{url}/tokenize", headers=alpha, json={"model": TINY_BOS, "prompt": "a"})
    assert tokenized.status_code == 404
    assert httpx.get(f"{url}/tokenizer_info", headers=alpha, params={"model": TINY_BOS}).status_code == 404
    # A request that names no model is for the tenant's one model, and refused with two.
    only = httpx.get(f"{url}/tokenizer_info", headers=as_(keys, "evaluator")).json()
    assert (only["eos_token"], only["model_max_length"]) == ("<|im_end|>", 512)
    two = httpx.post(f"{url}/tokenize", headers=beta, json={"prompt": "a"})
    assert (two.status_code, two.json()["error"]["param"]) == (400, "model")
    too_many = complete(url, alpha, logprobs=3)
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "logprobs"
    assert complete(url, beta, logprobs=3).status_code == 200  # beta has the model's 5


def test_the_request_rate_holds_across_both_ingress_replicas(url, keys, prometheus, alpha_refusal):
    alpha = as_(keys, "alpha")
    answers = []  # alpha's window may hold earlier requests: fewer than the limit may pass
    while (answer := httpx.get(f"{url}/v1/models", headers=alpha)).status_code == 200:
        answers.append(answer)
        assert len(answers) <= REQUESTS_PER_MINUTE
    assert answers[0].headers["x-ratelimit-limit-requests"] == str(REQUESTS_PER_MINUTE)
    assert [int(a.headers["x-ratelimit-remaining-requests"]) for a in answers] == \
        sorted((int(a.headers["x-ratelimit-remaining-requests"]) for a in answers), reverse=True)
    assert (answer.status_code, answer.json()["error"]["code"]) == (429, "rate_limit_exceeded")
    assert answer.headers["x-ratelimit-remaining-requests"] == "0"
    assert int(answer.headers["retry-after"]) >= 1 and answer.headers["x-ratelimit-reset-requests"]
    alpha_refusal.update(at=time.monotonic(), retry_after=int(answer.headers["retry-after"]))
    # Both ingress replicas answered alpha: the limit is theirs together (Redis), not each one's.
    poll_until(lambda: len(prometheus.query('sum by (replica) (probserve_requests_total{tenant="alpha", '
                                            'deployment="Ingress", application="tenancy"})')) >= 2,
               METRICS_WAIT_S, "one ingress replica answered every request", pause_s=1)


def timed(send: Callable[[], httpx.Response]) -> tuple[float, float, int | str]:
    """When a request left, when its answer came, and its status (or its transport error)."""
    sent = time.monotonic()
    try:
        status = send().status_code
    except httpx.HTTPError as error:
        status = type(error).__name__
    return sent, time.monotonic(), status


class Flood:
    """Clients of one tenant, each sending SAME_REQUEST again as soon as it has an answer,
    from entering the block to leaving it."""

    def __init__(self, url: str, headers: dict[str, str], clients: int):
        self.url, self.headers, self.stop = url, headers, threading.Event()
        self.sent: list[list] = [[] for _ in range(clients)]  # each client's timed requests
        self.threads = [threading.Thread(target=self.client, args=(mine,)) for mine in self.sent]

    def client(self, mine: list) -> None:
        deadline = time.monotonic() + FLOOD_LIMIT_S
        with httpx.Client(timeout=120) as client:
            while not self.stop.is_set() and time.monotonic() < deadline:
                mine.append(timed(lambda: client.post(f"{self.url}/v1/completions", headers=self.headers,
                                                      json={"model": TINY, **SAME_REQUEST})))

    def __enter__(self) -> "Flood":
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()

    def clients_answered(self) -> int:
        return sum(1 for mine in self.sent if mine)

    def requests(self) -> list[tuple[float, float, int | str]]:
        return list(itertools.chain.from_iterable(self.sent))


def tenancy_model():
    """The handle of the application's model replica (one): what its engine holds."""
    return serve.get_deployment_handle(model_deployment_name(TINY), app_name=APP)


def test_one_tenants_flood_waits_in_its_own_queue_while_the_others_are_served(url, keys):
    """Fair sharing, by what the engine holds and the order answers come in, not by timings
    (bench/tenant_flood.py times it): flood's clients, each sending again as soon as it has
    an answer, are many more than flood's bound, yet the engine never holds more of flood's
    requests than that bound per ingress replica; the others wait in flood's own queue, and
    beta's requests, the very same work, go ahead of them."""
    model = tenancy_model()
    model.peak_in_engine.remote("flood").result()  # counted from here
    with Flood(url, as_(keys, "flood"), FLOOD_CLIENTS) as flood:
        # Every client sends again at once: from here flood's queues hold waiters.
        read_until(flood.clients_answered, lambda answered: answered == FLOOD_CLIENTS, FLOOD_START_S,
                   "flood's clients answered", pause_s=0.5)
        beta = as_(keys, "beta")
        betas = [timed(lambda: complete(url, beta, **SAME_REQUEST)) for _ in range(BETA_REQUESTS)]
    floods = flood.requests()
    assert {status for _, _, status in floods + betas} == {200}
    peak = model.peak_in_engine.remote("flood").result()
    assert 1 <= peak <= FLOOD_MAX_IN_FLIGHT * INGRESS_REPLICAS, f"flood had {peak} in the engine at once"
    for sent, answered, _ in betas:  # each went ahead of a flood request waiting when it came
        assert any(flood_sent < sent and flood_answered > answered
                   for flood_sent, flood_answered, _ in floods), "beta's request waited behind all of flood's"


def amount(usage: dict, field: str) -> int:
    """A usage figure: "200" is the requests answered so."""
    return usage["requests"].get("200", 0) if field == "200" else usage[field]


def usage_grown_by(url, headers, before: dict, grown: dict[str, int], answered: int | None = None) -> dict:
    """The tenant's usage, read again until it has grown since `before` by `grown` ({field:
    amount}) and by `answered` 200s besides the reads of it (each counted once it is over,
    `before`'s too), then asserted to have grown by exactly that."""
    reads_before = itertools.count(1)  # `before`, then each read since

    def read() -> tuple[dict, dict[str, int], dict[str, int]]:
        usage = httpx.get(f"{url}/v1/usage", headers=headers).json()
        wanted = grown if answered is None else {**grown, "200": answered + next(reads_before)}
        return usage, wanted, {field: amount(usage, field) - amount(before, field) for field in wanted}
    def all_grown(figures) -> bool:
        return all(figures[2][field] >= n for field, n in figures[1].items())
    usage, wanted, got = read_until(read, all_grown, USAGE_WAIT_S, "usage (as read, wanted growth, growth)",
                                    pause_s=0.5)
    assert got == wanted
    return usage


def test_usage_reads_back_what_the_tenant_sent(url, keys, prometheus):
    delta = as_(keys, "beta")
    before = httpx.get(f"{url}/v1/usage", headers=delta).json()
    sent = {"prompt_tokens": 0, "generated_tokens": 0, "scored_tokens": 0}
    for length in (5, 9):
        answer = complete(url, delta, prompt=list(range(10, 10 + length)), echo=True, logprobs=1).json()
        sent["prompt_tokens"] += answer["usage"]["prompt_tokens"]
        sent["scored_tokens"] += length
        sent["generated_tokens"] += answer["usage"]["completion_tokens"]
    full = httpx.post(f"{url}/v1/completions", headers=delta | {"accept-encoding": "gzip"}, timeout=60,
                      json={"model": TINY, "prompt": list(range(10, 22)), "max_tokens": 1,
                            "prompt_logprobs": -1})
    assert full.status_code == 200
    sent["prompt_tokens"] += 12
    sent["scored_tokens"] += 12
    sent["generated_tokens"] += 1
    sent["full_vocab_bytes"] = full.num_bytes_downloaded
    after = usage_grown_by(url, delta, before, sent, answered=3)
    assert after["tenant"] == "beta"
    query = 'sum(probserve_request_prompt_tokens_total{tenant="beta", application="tenancy"})'
    read_until(lambda: prometheus.value(query), lambda exported: exported >= after["prompt_tokens"],
               METRICS_WAIT_S, f"Prometheus's count of the tenant's {after['prompt_tokens']} prompt tokens",
               pause_s=1)
    assert prometheus.value(query) == after["prompt_tokens"]  # once there, the two counts are equal


def test_each_tenant_has_its_own_prefix_caches(url, keys):
    """The same prompt, echoed: its second time for one tenant comes from the scored-prefix
    cache, its first for another tenant computes it all (and reads no KV block) with the same
    numbers."""
    prompt, answers = list(range(300, 600)), []
    for tenant, served in (("beta", 0), ("beta", 256), ("flood", 0)):
        before = counted(TINY, APP)
        answer = complete(url, as_(keys, tenant), prompt=prompt, max_tokens=1, echo=True, logprobs=1)
        assert answer.status_code == 200, answer.text
        answers.append(answer.json()["choices"][0]["logprobs"])
        after = counted(TINY, APP)
        for total in ("scored_from_cache", "cache_read"):
            assert after[total] - before[total] == served, (tenant, total)
    for answer in answers[1:]:  # the prompt's rows (the sampled token after them may differ)
        assert answer["tokens"][:len(prompt)] == answers[0]["tokens"][:len(prompt)]
        np.testing.assert_allclose(answer["token_logprobs"][1:len(prompt)],
                                   answers[0]["token_logprobs"][1:len(prompt)], atol=TOLERANCE)


def completed(batch: dict) -> bool:
    return batch["status"] == "completed"


def batch_when(batch_url: str, headers: dict[str, str], reached: Callable[[dict], bool],
               statuses_before: tuple[str, ...]) -> dict:
    """The batch, read again until `reached` holds of it, in one of `statuses_before` until then."""
    def reached_so_far(batch: dict) -> bool:
        assert reached(batch) or batch["status"] in statuses_before, batch
        return reached(batch)
    return read_until(lambda: httpx.get(batch_url, headers=headers).json(), reached_so_far, BATCH_WAIT_S,
                      "batch", pause_s=0.5)


def test_a_tenant_s_files_and_batches_are_its_own_and_its_batch_counts_in_its_usage(url, keys):
    beta, others = as_(keys, "beta"), [as_(keys, "flood"), {}]
    before = httpx.get(f"{url}/v1/usage", headers=beta).json()
    lines = b"".join(orjson.dumps({"custom_id": str(i), "method": "POST", "url": "/v1/completions",
                                   "body": {"model": TINY, "prompt": list(range(10, 20)), "max_tokens": 1}})
                     + b"\n" for i in range(3))
    uploaded = httpx.post(f"{url}/v1/files", headers=beta, data={"purpose": "batch"},
                          files={"file": ("in.jsonl", lines)}).json()
    batch = httpx.post(f"{url}/v1/batches", headers=beta, json={
        "input_file_id": uploaded["id"], "endpoint": "/v1/completions", "completion_window": "24h"}).json()
    for headers in others:  # another tenant, and no key at all
        for path in (f"/v1/files/{uploaded['id']}", f"/v1/files/{uploaded['id']}/content",
                     f"/v1/batches/{batch['id']}"):
            assert httpx.get(f"{url}{path}", headers=headers).status_code == (404 if headers else 401), path
    listed = httpx.get(f"{url}/v1/files", headers=others[0]).json()["data"]
    assert uploaded["id"] not in {f["id"] for f in listed}
    batch_when(f"{url}/v1/batches/{batch['id']}", beta, completed, ("validating", "in_progress"))
    usage_grown_by(url, beta, before, {"prompt_tokens": 3 * 10, "generated_tokens": 3})


def test_the_viewer_asks_for_a_key_and_shows_the_tenant_s_refusals(url, keys, tmp_path, screenshots):
    browser = Browser(tmp_path)
    try:
        browser.open(f"{url}/ui")
        refused = browser.visible("#error")
        assert refused.get_attribute("data-code") == "missing_api_key" and refused.text.startswith("401 ")
        assert browser.find("#key-row").is_displayed()
        browser.screenshot(screenshots / "viewer-key.png")
        browser.find("#api-key").send_keys(keys["made"]["beta"])
        browser.find("#use-key").click()
        browser.wait_for(lambda _: [o.get_attribute("value") for o in browser.find_all("#model option")]
                         == [TINY, TINY_BOS])
        assert not browser.find("#error").is_displayed()
        # The key stays in this tab's session storage, nowhere else.
        assert browser.script("return sessionStorage.getItem('probserve.apiKey')") == keys["made"]["beta"]
        assert browser.script("return localStorage.length") == 0 and browser.driver.get_cookies() == []
        # A key that may not use the chosen model (one given in another tab of the session).
        Select(browser.find("#model")).select_by_value(TINY_BOS)
        browser.script("sessionStorage.setItem('probserve.apiKey', arguments[0])", keys["made"]["viewer"])
        click_and_wait(browser, "#score")
        assert browser.find("#error").get_attribute("data-code") == "model_not_found"
        assert f"model '{TINY_BOS}' does not exist" in browser.find("#error").text
        # The tenant's rate: the refusal above counted, two answers, then 429 with its wait.
        Select(browser.find("#model")).select_by_value(TINY)
        for _ in range(VIEWER_REQUESTS_PER_MINUTE - 1):
            click_and_wait(browser, "#score")
            assert not browser.find("#error").is_displayed(), browser.find("#error").text
        click_and_wait(browser, "#score")
        limited = browser.find("#error")
        assert limited.get_attribute("data-code") == "rate_limit_exceeded"
        assert limited.text.startswith("429 rate_limit_exceeded: ") and "(retry in " in limited.text
    finally:
        browser.quit()


def test_a_tenant_s_loaded_adapter_is_its_own_on_both_ingress_replicas(url, keys):
    """Loaded with beta's key, kept in Redis: beta lists and scores it through either ingress
    replica; another tenant is told it does not exist, and cannot unload it."""
    beta, evaluator, name = as_(keys, "beta"), as_(keys, "evaluator"), f"beta-{uuid.uuid4().hex[:8]}"
    loaded(url, beta, name, adapter_path(adapter_name(TINY, 8)))
    assert name in model_ids(url, beta) and name not in model_ids(url, evaluator)
    adapted, base = echo_logprobs(url, beta, name), echo_logprobs(url, beta, TINY)
    assert max(abs(a - b) for a, b in zip(adapted[1:], base[1:], strict=True)) > 0.05  # the adapter's
    for _ in range(4 * INGRESS_REPLICAS):  # whichever ingress replica answers
        assert echo_logprobs(url, beta, name) == adapted
    assert code_of(complete(url, evaluator, name), 404) == "model_not_found"
    assert code_of(unload_adapter(url, evaluator, name), 404) == "model_not_found"
    assert code_of(load_adapter(url, evaluator, name, TUNER_ROOT), 409) == "adapter_name_taken"
    assert code_of(load_adapter(url, beta, f"{name}-r16", adapter_path(adapter_name(TINY, 16))),
                   400) == "adapter_rank_too_large"
    assert unload_adapter(url, beta, name).status_code == 200
    assert code_of(complete(url, beta, name), 404) == "model_not_found"


def test_a_tenant_loads_adapters_within_its_count_and_its_folders(url, keys):
    tuner, first = as_(keys, "tuner"), f"tuner-{uuid.uuid4().hex[:8]}"
    assert code_of(load_adapter(url, tuner, first, adapter_path(adapter_name(TINY, 16))),
                   400) == "adapter_path_not_allowed"
    loaded(url, tuner, first, TUNER_ROOT)
    assert code_of(load_adapter(url, tuner, f"{first}-2", TUNER_ROOT), 400) == "adapter_limit_reached"
    assert unload_adapter(url, tuner, first).status_code == 200
    loaded(url, tuner, f"{first}-2", TUNER_ROOT)
    assert unload_adapter(url, tuner, f"{first}-2").status_code == 200


def test_a_batch_survives_the_whole_service_redeployed_with_every_line_once(url, keys, app_args):
    """Every deployment of the application (both ingress replicas, the model, the pool, the
    batch runner) deleted mid-batch and deployed again: what the batch has done lives in its
    storage, and the new runner takes it up from there: each line is answered once, as the
    same request is online."""
    beta, count = as_(keys, "beta"), 300
    prompts = [[1000 + i, *range(10, 70)] for i in range(count)]  # each its own first token: none cached
    lines = b"".join(orjson.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions",
                                   "body": {"model": TINY, "prompt": prompt, **SCORING}}) + b"\n"
                     for i, prompt in enumerate(prompts))
    uploaded = httpx.post(f"{url}/v1/files", headers=beta, data={"purpose": "batch"},
                          files={"file": ("in.jsonl", lines)}).json()
    batch = httpx.post(f"{url}/v1/batches", headers=beta, json={
        "input_file_id": uploaded["id"], "endpoint": "/v1/completions", "completion_window": "24h"}).json()
    batch_url = f"{url}/v1/batches/{batch['id']}"
    batch_when(batch_url, beta, lambda started: started["request_counts"]["completed"] >= 10,
               ("validating", "in_progress"))
    # A loaded adapter lives in Redis: new ingress and model replicas serve it as before.
    adapter = f"beta-kept-{uuid.uuid4().hex[:8]}"
    loaded(url, beta, adapter, adapter_path(adapter_name(TINY, 8)))
    before = echo_logprobs(url, beta, adapter)
    serve.delete(APP)
    deploy(app_args, url)
    redeployed_at = int(time.time())
    assert echo_logprobs(url, beta, adapter) == pytest.approx(before, abs=TOLERANCE)
    assert unload_adapter(url, beta, adapter).status_code == 200
    batch = batch_when(batch_url, beta, completed, ("in_progress",))
    assert batch["error_file_id"] is None and batch["completed_at"] >= redeployed_at
    assert batch["request_counts"] == {"total": count, "completed": count, "failed": 0}
    done = httpx.get(f"{url}/v1/files/{batch['output_file_id']}/content", headers=beta)
    answered = [orjson.loads(line) for line in done.content.splitlines()]
    assert sorted(line["custom_id"] for line in answered) == sorted(f"line-{i}" for i in range(count))  # once
    answers = {line["custom_id"]: line["response"]["body"]["choices"] for line in answered}
    for i, online in enumerate(online_choices(url, as_(keys, "flood"), prompts)):
        (line_choice,) = answers[f"line-{i}"]
        assert_same_choice(line_choice, online)


def test_the_request_rate_resets_after_its_window(url, keys, alpha_refusal):
    """The rate test left alpha refused; the tests between (the whole service redeployed among
    them: the count lives in Redis) took most of its window. Alpha is answered again, and not
    before the refusal's Retry-After."""
    refused_at, retry_after = alpha_refusal["at"], alpha_refusal["retry_after"]
    while (answer := httpx.get(f"{url}/v1/models", headers=as_(keys, "alpha"))).status_code == 429:
        assert answer.json()["error"]["code"] == "rate_limit_exceeded"
        assert time.monotonic() - refused_at < 150, "the window never reset"
        time.sleep(2)
    assert answer.status_code == 200
    assert time.monotonic() - refused_at >= retry_after - 1, "the window reset early"


def test_redis_going_away_fails_closed_with_503_and_its_return_is_served_at_once(url, keys, redis_server):
    alpha, beta = as_(keys, "alpha"), as_(keys, "beta")  # alpha has a rate: its requests need the storage
    redis_server.stop()
    try:
        answer = complete(url, alpha)
        assert (answer.status_code, answer.json()["error"]["code"]) == (503, "rate_limit_unavailable")
        assert answer.headers["retry-after"]
        usage = httpx.get(f"{url}/v1/usage", headers=beta)  # beta has no rate to count
        assert (usage.status_code, usage.json()["error"]["code"]) == (503, "usage_unavailable")
        for refused in (complete(url, beta, "beta-adapter"),
                        load_adapter(url, beta, "beta-adapter", TUNER_ROOT)):
            assert code_of(refused, 503) == "adapter_registry_unavailable" and refused.headers["retry-after"]
    finally:
        redis_server.start()
    # Every store's pooled connections died with Redis: each tries a fresh one (on both ingress
    # replicas), so the first requests after are served.
    for _ in range(INGRESS_REPLICAS):  # within alpha's rate
        assert complete(url, alpha).status_code == 200
    for _ in range(2 * INGRESS_REPLICAS):
        assert httpx.get(f"{url}/v1/usage", headers=beta).status_code == 200
        assert code_of(complete(url, beta, "beta-adapter"), 404) == "model_not_found"


def online_choices(url: str, headers: dict[str, str], prompts: list[list[int]]) -> list[dict]:
    """Each prompt's choice in answer to SCORING online, ONLINE_PROMPTS prompts a request."""
    choices = []
    for start in range(0, len(prompts), ONLINE_PROMPTS):
        answer = complete(url, headers, prompt=prompts[start:start + ONLINE_PROMPTS], **SCORING)
        assert answer.status_code == 200, answer.text
        choices += sorted(answer.json()["choices"], key=lambda choice: choice["index"])
    assert len(choices) == len(prompts)
    return choices


def load_adapter(url, headers, name: str, folder) -> httpx.Response:
    return httpx.post(f"{url}/v1/load_lora_adapter", headers=headers, timeout=60,
                      json={"lora_name": name, "lora_path": str(folder)})


def loaded(url, headers, name: str, folder) -> None:
    response = load_adapter(url, headers, name, folder)
    assert response.status_code == 200, response.text


def unload_adapter(url, headers, name: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/unload_lora_adapter", headers=headers, timeout=60, json={"lora_name": name})


def echo_logprobs(url, headers, model: str) -> list[float]:
    response = complete(url, headers, model, max_tokens=1, temperature=0, echo=True, logprobs=0)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["logprobs"]["token_logprobs"]


def model_ids(url, headers) -> list[str]:
    return [card["id"] for card in httpx.get(f"{url}/v1/models", headers=headers).json()["data"]]


def code_of(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    return response.json()["error"]["code"]


def test_no_key_and_no_prompt_in_any_log_or_in_the_key_file(url, keys):
    assert not any(key in keys["key_file"].read_text() for key in keys["made"].values())
    for path in session_logs():
        if path.is_file():
            content = path.read_bytes()
            assert SECRET_WORD.encode() not in content, f"{path} holds prompt text"
            for key in keys["made"].values():
                assert key.encode() not in content and key.split("_", 2)[2].encode() not in content, \
                    f"{path} holds a key"
