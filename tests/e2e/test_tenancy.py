"""Tenants and keys over HTTP, on a second application with two ingress replicas that share
one real Redis (Debian's redis-server, started here): every error, model visibility and
tighter caps, a request rate that holds across both replicas and resets, fair sharing under a
flood, usage read back, Redis going away, the viewer asking for a key and showing a tenant's
refusals, and no key or prompt in any log."""

import shutil
import statistics
import subprocess
import threading
import time
import uuid

import httpx
import numpy as np
import orjson
import pytest
from ray import serve
from selenium.webdriver.support.ui import Select

from probserve.ops.app import build_app
from probserve.store.model_store import TINY, TINY_BOS
from probserve.tenants import keyring
from probserve.tenants.keyring import KeyFile, Tenant, TenantCaps, TenantLimits
from tests.e2e.browser import Browser
from tests.e2e.conftest import TINY_KV_GIB, free_port
from tests.e2e.reference import TOLERANCE
from tests.e2e.test_prefix_reuse import KV_READS, SCORED_SERVED, exported, grown
from tests.e2e.test_request_log import session_logs
from tests.e2e.test_viewer import click_and_wait

APP, PREFIX = "tenancy", "/tenancy"
REQUESTS_PER_MINUTE = 8  # alpha's
VIEWER_REQUESTS_PER_MINUTE = 3  # the viewer test's tenant's
SECRET_WORD = f"tenant-secret-{uuid.uuid4().hex}"
# Metrics reach Prometheus through Ray's metrics agent (reports every 2 s) and a scrape (every
# 3 s), both slower on a loaded machine.
METRICS_WAIT_S = 90


class RedisServer:
    def __init__(self, port: int, folder):
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed: `make test` installs Debian's package"
        self.command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                        "--appendonly", "no", "--dir", str(folder)]
        self.port = port
        self.start()

    def start(self) -> None:
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True,
                             text=True).stdout.strip() != "PONG":
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    server = RedisServer(free_port(), tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """alpha: the first tiny model only, tighter caps, a request rate, two in flight; beta:
    both models, no limits; gamma: a key that gets revoked; flood: one in flight, eight
    waiting; viewer: the first model only, three requests a minute."""
    folder = tmp_path_factory.mktemp("keys")
    secret_file, key_file = folder / "secret", folder / "keys.yaml"
    secret_file.write_text(keyring.new_secret())
    secret = keyring.read_secret(secret_file)
    made, document = {}, KeyFile(tenants={
        "alpha": Tenant(models=[TINY], caps=TenantCaps(max_logprobs=2),
                        limits=TenantLimits(requests_per_minute=REQUESTS_PER_MINUTE, max_in_flight=2)),
        "beta": Tenant(), "gamma": Tenant(),
        "flood": Tenant(limits=TenantLimits(max_in_flight=1, max_waiting=8)),
        "viewer": Tenant(models=[TINY], limits=TenantLimits(requests_per_minute=VIEWER_REQUESTS_PER_MINUTE))})
    for name in ("alpha", "beta", "gamma", "flood", "viewer"):
        document, made[name] = keyring.create_key(document, name, secret)
    document.write(key_file)
    return {"key_file": key_file, "secret_file": secret_file, "made": made}


@pytest.fixture(scope="module")
def app_args(redis_server, keys, tmp_path_factory) -> dict:
    tiny = {"capabilities": {"max_logprobs": 5, "max_model_len": 512}, "cpu_kv_cache_gib": TINY_KV_GIB,
            "ray_actor_options": {"num_cpus": 0.01}}
    # The second model is only listed and refused here, never sent to: scaled to zero, it
    # costs no engine.
    idle = {"autoscaling_config": {"min_replicas": 0, "max_replicas": 1}}
    args = {"models": [{"name": TINY, **tiny}, {"name": TINY_BOS, **tiny, **idle}],
            "ingress": {"autoscaling_config": {"min_replicas": 2, "max_replicas": 2},
                        "ray_actor_options": {"num_cpus": 0.01}},
            "serializer_pool": {"ray_actor_options": {"num_cpus": 0.01}},
            "tenancy": {"key_file": str(keys["key_file"]), "secret_file": str(keys["secret_file"]),
                        "reload_s": 1, "storage": f"redis://127.0.0.1:{redis_server.port}/0"},
            "batch": {"storage": str(tmp_path_factory.mktemp("tenancy-batch")),
                      "ray_actor_options": {"num_cpus": 0.01}}}
    return args


@pytest.fixture(scope="module")
def url(base_url, app_args):
    serve.run(build_app(app_args), name=APP, route_prefix=PREFIX)
    yield f"{base_url}{PREFIX}"
    serve.delete(APP)


@pytest.fixture(scope="module")
def alpha_refusal() -> dict:
    """When alpha's rate was first refused, and the wait it was told (the rate tests)."""
    return {}


def as_(keys, name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {keys['made'][name]}"}


def complete(url, headers, model=TINY, **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", headers=headers, timeout=60,
                      json={"model": model, "prompt": f"{SECRET_WORD} counts", "max_tokens": 2, **body})


def test_keys_are_required_and_checked(url, keys):
    missing = complete(url, {})
    assert (missing.status_code, missing.json()["error"]["code"]) == (401, "missing_api_key")
    wrong = complete(url, {"authorization": "Bearer psk_0123456789ab_notakey"})
    assert (wrong.status_code, wrong.json()["error"]["code"]) == (401, "invalid_api_key")
    for path in ("/v1/models", "/v1/usage"):
        assert httpx.get(f"{url}{path}").status_code == 401
    assert httpx.post(f"{url}/tokenize", json={"model": TINY, "prompt": "a"}).status_code == 401
    assert httpx.get(f"{url}/health").status_code == 200 and httpx.get(f"{url}/livez").status_code == 200
    assert complete(url, as_(keys, "beta")).status_code == 200


def test_a_revoked_key_stops_working_without_a_restart(url, keys):
    assert complete(url, as_(keys, "gamma")).status_code == 200
    document = KeyFile.read(keys["key_file"])
    gamma = next(key.id for key in document.keys if key.tenant == "gamma")
    keyring.revoke_key(document, gamma).write(keys["key_file"])
    deadline = time.monotonic() + 30
    while (answer := complete(url, as_(keys, "gamma"))).status_code == 200:
        assert time.monotonic() < deadline, "the revoked key still works"
        time.sleep(0.5)
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
    deadline = time.monotonic() + METRICS_WAIT_S
    while len(prometheus.query('sum by (replica) (probserve_requests_total{tenant="alpha", '
                               'deployment="Ingress", application="tenancy"})')) < 2:
        assert time.monotonic() < deadline, "one ingress replica answered every request"
        time.sleep(1)


def test_one_tenants_flood_waits_in_its_own_queue_while_the_others_are_served(url, keys, capsys):
    """Fair sharing, checked within one run rather than against a wall-clock bound: under the
    flood, another tenant's requests are answered well before the flood's own, which wait in
    its queue. Beta's latency idle and under the flood is printed (docs/tenancy.md)."""
    beta = as_(keys, "beta")

    def beta_latency() -> float:
        times = []
        for _ in range(11):
            started = time.monotonic()
            assert complete(url, beta, max_tokens=8, temperature=0).status_code == 200
            times.append(time.monotonic() - started)
        return statistics.median(times)
    idle = beta_latency()
    stop, answers = threading.Event(), []

    def flood() -> None:
        """A client that sends again as soon as it has an answer; eight of them, against
        flood's bound of one in flight per ingress replica: the others wait in flood's queue."""
        with httpx.Client(timeout=120) as client:
            while not stop.is_set():
                started = time.monotonic()
                status = client.post(f"{url}/v1/completions", headers=as_(keys, "flood"),
                                     json={"model": TINY, "prompt": "flood", "max_tokens": 32}).status_code
                answers.append((status, time.monotonic() - started))
    threads = [threading.Thread(target=flood) for _ in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(3)
    try:
        busy = beta_latency()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert {status for status, _ in answers} == {200}
    flood_median = statistics.median(seconds for _, seconds in answers)
    assert flood_median > 2 * busy, "flood's requests did not wait in its own queue"
    with capsys.disabled():
        print(f"\nbeta's median latency: idle {idle:.3f} s, under the flood {busy:.3f} s "
              f"({busy / idle:.2f}x); flood's {len(answers)} requests: median {flood_median:.3f} s")


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
    time.sleep(1)  # usage is added once each response is over
    after = httpx.get(f"{url}/v1/usage", headers=delta).json()
    assert after["tenant"] == "beta"
    for field, value in sent.items():
        assert after[field] - before[field] == value, field
    assert after["requests"]["200"] - before["requests"]["200"] == 4  # 3 completions and a usage read
    assert after["full_vocab_bytes"] - before["full_vocab_bytes"] == full.num_bytes_downloaded
    deadline = time.monotonic() + METRICS_WAIT_S  # then the two counts must be equal
    query = 'sum(probserve_request_prompt_tokens_total{tenant="beta", application="tenancy"})'
    while (exported := prometheus.value(query)) < after["prompt_tokens"]:
        assert time.monotonic() < deadline, \
            f"Prometheus has {exported} of the tenant's {after['prompt_tokens']} prompt tokens"
        time.sleep(1)
    assert prometheus.value(query) == after["prompt_tokens"]


def test_each_tenant_has_its_own_prefix_caches(url, keys, metrics_port):
    """The same prompt, echoed: its second time for one tenant comes from the scored-prefix
    cache, its first for another tenant computes it all (and reads no KV block) with the same
    numbers."""
    metrics_url, prompt = f"http://127.0.0.1:{metrics_port}/metrics", list(range(300, 600))
    answers = []
    for tenant, served in (("beta", 0), ("beta", 256), ("flood", 0)):
        before = [exported(metrics_url, metric, TINY, APP) for metric in (SCORED_SERVED, KV_READS)]
        answer = complete(url, as_(keys, tenant), prompt=prompt, max_tokens=1, echo=True, logprobs=1)
        assert answer.status_code == 200, answer.text
        answers.append(answer.json()["choices"][0]["logprobs"])
        for metric, start in zip((SCORED_SERVED, KV_READS), before, strict=True):
            assert grown(metrics_url, metric, TINY, start, served, APP) == served, (tenant, metric)
    for answer in answers[1:]:  # the prompt's rows (the sampled token after them may differ)
        assert answer["tokens"][:len(prompt)] == answers[0]["tokens"][:len(prompt)]
        np.testing.assert_allclose(answer["token_logprobs"][1:len(prompt)],
                                   answers[0]["token_logprobs"][1:len(prompt)], atol=TOLERANCE)


def test_the_request_rate_resets_after_its_window(url, keys, alpha_refusal):
    """The rate test left alpha refused; the tests between took much of its window. Alpha is
    answered again, and not before the refusal's Retry-After."""
    refused_at, retry_after = alpha_refusal["at"], alpha_refusal["retry_after"]
    while (answer := httpx.get(f"{url}/v1/models", headers=as_(keys, "alpha"))).status_code == 429:
        assert answer.json()["error"]["code"] == "rate_limit_exceeded"
        assert time.monotonic() - refused_at < 150, "the window never reset"
        time.sleep(2)
    assert answer.status_code == 200
    assert time.monotonic() - refused_at >= retry_after - 1, "the window reset early"


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
    deadline, batch_url = time.monotonic() + 60, f"{url}/v1/batches/{batch['id']}"
    while (batch := httpx.get(batch_url, headers=beta).json())["status"] != "completed":
        assert time.monotonic() < deadline, batch
        time.sleep(0.5)
    time.sleep(1)  # usage is added once each line is over
    after = httpx.get(f"{url}/v1/usage", headers=beta).json()
    assert after["prompt_tokens"] - before["prompt_tokens"] == 3 * 10
    assert after["generated_tokens"] - before["generated_tokens"] == 3


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


def test_redis_going_away_fails_closed_with_503_and_comes_back(url, keys, redis_server):
    alpha = as_(keys, "alpha")  # a tenant with a rate: its requests need the storage
    redis_server.stop()
    try:
        answer = complete(url, alpha)
        assert (answer.status_code, answer.json()["error"]["code"]) == (503, "rate_limit_unavailable")
        assert answer.headers["retry-after"]
        usage = httpx.get(f"{url}/v1/usage", headers=as_(keys, "beta"))  # beta has no rate to count
        assert (usage.status_code, usage.json()["error"]["code"]) == (503, "usage_unavailable")
    finally:
        redis_server.start()
    back = time.monotonic()  # its clients reconnect on their next commands
    while (answer := complete(url, alpha)).status_code != 200:
        assert answer.json()["error"]["code"] == "rate_limit_unavailable"
        assert time.monotonic() - back < 20, "the service did not come back with Redis"
        time.sleep(0.5)


def test_a_batch_survives_the_whole_service_redeployed_with_every_line_once(url, keys, app_args):
    """Every deployment of the application (both ingress replicas, the model, the pool, the
    batch runner) deleted mid-batch and deployed again: what the batch has done lives in its
    storage, and the new runner takes it up from there."""
    beta, count = as_(keys, "beta"), 300  # each its own first token: none read from a cache
    lines = b"".join(orjson.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/completions",
                                   "body": {"model": TINY, "prompt": [1000 + i, *range(10, 70)],
                                            "max_tokens": 1, "echo": True, "logprobs": 1}}) + b"\n"
                     for i in range(count))
    uploaded = httpx.post(f"{url}/v1/files", headers=beta, data={"purpose": "batch"},
                          files={"file": ("in.jsonl", lines)}).json()
    batch = httpx.post(f"{url}/v1/batches", headers=beta, json={
        "input_file_id": uploaded["id"], "endpoint": "/v1/completions", "completion_window": "24h"}).json()
    batch_url = f"{url}/v1/batches/{batch['id']}"
    while (batch := httpx.get(batch_url, headers=beta).json())["request_counts"]["completed"] < 10:
        assert batch["status"] in ("validating", "in_progress"), batch
        time.sleep(0.2)
    serve.delete(APP)
    serve.run(build_app(app_args), name=APP, route_prefix=PREFIX)
    redeployed_at, deadline = int(time.time()), time.monotonic() + 240
    while (batch := httpx.get(batch_url, headers=beta).json())["status"] != "completed":
        assert batch["status"] == "in_progress" and time.monotonic() < deadline, batch
        time.sleep(0.5)
    done = httpx.get(f"{url}/v1/files/{batch['output_file_id']}/content", headers=beta)
    custom_ids = [orjson.loads(line)["custom_id"] for line in done.content.splitlines()]
    assert sorted(custom_ids) == sorted(f"line-{i}" for i in range(count))  # each exactly once
    assert batch["error_file_id"] is None and batch["completed_at"] >= redeployed_at
    assert batch["request_counts"] == {"total": count, "completed": count, "failed": 0}


def test_no_key_and_no_prompt_in_any_log_or_in_the_key_file(url, keys):
    assert not any(key in keys["key_file"].read_text() for key in keys["made"].values())
    for path in session_logs():
        if path.is_file():
            content = path.read_bytes()
            assert SECRET_WORD.encode() not in content, f"{path} holds prompt text"
            for key in keys["made"].values():
                assert key.encode() not in content and key.split("_", 2)[2].encode() not in content, \
                    f"{path} holds a key"
