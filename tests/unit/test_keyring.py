import asyncio

import pytest
from limits.aio.storage import MemoryStorage

from serve_app.config import Capabilities
from serve_app.errors import APIError
from serve_app.observe.request_log import RequestRecord
from serve_app.tenants.keyring import (
    KeyFile,
    Keyring,
    Tenant,
    TenantCaps,
    TenantLimits,
    WatchedKeyring,
    create_key,
    new_secret,
    read_secret,
    revoke_key,
)
from serve_app.tenants.quotas import RateLimits, TenantQueues, duration, request_tokens
from serve_app.tenants.usage import MemoryUsage, counts, usage_body

SECRET = b"s" * 32


def with_keys(*tenants: str) -> tuple[KeyFile, dict[str, str]]:
    keys, made = KeyFile(), {}
    for tenant in tenants:
        keys, made[tenant] = create_key(keys, tenant, SECRET)
    return keys, made


def refused(call) -> APIError:
    with pytest.raises(APIError) as caught:
        call()
    return caught.value


def test_a_key_authenticates_its_tenant_and_the_file_holds_no_key(tmp_path):
    keys, made = with_keys("a", "b")
    path = tmp_path / "keys.yaml"
    keys.write(path)
    text = path.read_text()
    assert made["a"] not in text and made["a"].split("_", 2)[2] not in text
    ring = Keyring(KeyFile.read(path), SECRET)
    assert ring.tenant(f"Bearer {made['a']}") == "a" and ring.tenant(f"bearer {made['b']}") == "b"
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_the_key_file_authenticates_nothing_without_the_server_secret():
    keys, made = with_keys("a")
    with pytest.raises(APIError):
        Keyring(keys, b"another secret of thirty-two bytes!").tenant(f"Bearer {made['a']}")


@pytest.mark.parametrize("header, code", [
    (None, "missing_api_key"), ("", "missing_api_key"), ("Basic abc", "missing_api_key"),
    ("Bearer ", "missing_api_key"), ("Bearer nonsense", "invalid_api_key"),
    ("Bearer psk_000000000000_x", "invalid_api_key"),
])
def test_bad_headers_get_401_with_their_code(header, code):
    keys, _ = with_keys("a")
    error = refused(lambda: Keyring(keys, SECRET).tenant(header))
    assert (error.status, error.code) == (401, code)


def test_a_tampered_or_revoked_key_is_invalid():
    keys, made = with_keys("a")
    tampered = made["a"][:-1] + ("A" if made["a"][-1] != "A" else "B")
    assert refused(lambda: Keyring(keys, SECRET).tenant(f"Bearer {tampered}")).code == "invalid_api_key"
    revoked = revoke_key(keys, keys.keys[0].id)
    assert refused(lambda: Keyring(revoked, SECRET).tenant(f"Bearer {made['a']}")).code == "invalid_api_key"
    with pytest.raises(KeyError):
        revoke_key(keys, "ffffffffffff")


def test_keys_must_name_defined_tenants():
    keys, _ = with_keys("a")
    with pytest.raises(ValueError):
        KeyFile(tenants={}, keys=keys.keys)


def test_a_changed_key_file_is_read_again_and_a_broken_one_keeps_the_last(tmp_path):
    keys, made = with_keys("a")
    key_file, secret_file = tmp_path / "keys.yaml", tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    keys.write(key_file)
    reports = []
    watched = WatchedKeyring(key_file, secret_file, check_s=0, report=reports.append)
    assert watched.current().tenant(f"Bearer {made['a']}") == "a"
    revoke_key(keys, keys.keys[0].id).write(key_file)
    assert refused(lambda: watched.current().tenant(f"Bearer {made['a']}")).code == "invalid_api_key"
    keys, more = create_key(keys, "b", SECRET)
    key_file.write_text("tenants: [not a mapping")
    assert refused(lambda: watched.current().tenant(f"Bearer {more}")).code == "invalid_api_key"
    assert "not reloaded" in reports[-1]
    keys.write(key_file)
    assert watched.current().tenant(f"Bearer {more}") == "b"


def test_a_tenant_sees_its_models_with_the_lower_of_each_cap():
    tenant = Tenant(models=["m1"], caps=TenantCaps(max_logprobs=5, full_vocab_max_prompt_tokens=4096))
    model = Capabilities(max_logprobs=20, full_vocab_max_prompt_tokens=128)
    assert tenant.allows("m1") and not tenant.allows("m2") and Tenant().allows("anything")
    caps = tenant.capabilities(model)
    assert (caps.max_logprobs, caps.full_vocab_max_prompt_tokens) == (5, 128)
    assert caps.max_model_len == model.max_model_len


def test_server_secrets_are_long_enough(tmp_path):
    short = tmp_path / "short"
    short.write_text("tiny")
    with pytest.raises(ValueError):
        read_secret(short)
    made = tmp_path / "made"
    made.write_text(new_secret())
    assert len(read_secret(made)) >= 32


def rate_limits(on_failure="closed", storage=None) -> RateLimits:
    return RateLimits(storage or MemoryStorage(), on_failure, retry_after_s=3)


def test_requests_per_minute_then_429_with_openai_headers():
    async def run():
        limits = rate_limits()
        first = await limits.charge("t", "requests", 2, 1, "requests")
        assert first["x-ratelimit-limit-requests"] == "2" and first["x-ratelimit-remaining-requests"] == "1"
        await limits.charge("t", "requests", 2, 1, "requests")
        with pytest.raises(APIError) as caught:
            await limits.charge("t", "requests", 2, 1, "requests")
        error = caught.value
        assert (error.status, error.code) == (429, "rate_limit_exceeded")
        assert error.headers["x-ratelimit-remaining-requests"] == "0"
        assert int(error.headers["Retry-After"]) >= 1
        assert error.headers["x-ratelimit-reset-requests"].endswith("s")
        assert await limits.charge("other", "requests", 2, 1, "requests")  # tenants apart
        assert await limits.charge("t", "requests", None, 1, "requests") == {}  # no limit
    asyncio.run(run())


def test_tokens_beyond_the_whole_limit_are_refused_and_generation_fills_the_window():
    async def run():
        limits = rate_limits()
        with pytest.raises(APIError) as caught:
            await limits.charge("t", "tokens", 100, 101, "this request's prompt tokens")
        assert "whole limit" in caught.value.message
        await limits.charge("t", "tokens", 100, 60, "prompt")
        await limits.add_after("t", 100, 500)  # more than fits: the window is filled
        with pytest.raises(APIError):
            await limits.charge("t", "tokens", 100, 1, "prompt")
    asyncio.run(run())


class BrokenStorage(MemoryStorage):
    async def incr(self, *args, **kwargs):
        raise ConnectionError("redis went away")

    async def get_sliding_window(self, *args, **kwargs):
        raise ConnectionError("redis went away")

    async def acquire_sliding_window_entry(self, *args, **kwargs):
        raise ConnectionError("redis went away")


def test_an_unreachable_storage_follows_the_policy():
    async def run():
        assert await rate_limits("open", BrokenStorage()).charge("t", "requests", 1, 1, "requests") == {}
        with pytest.raises(APIError) as caught:
            await rate_limits("closed", BrokenStorage()).charge("t", "requests", 1, 1, "requests")
        assert (caught.value.status, caught.value.code) == (503, "rate_limit_unavailable")
        await rate_limits("closed", BrokenStorage()).add_after("t", 10, 5)  # logged, not raised
    asyncio.run(run())


def test_beyond_its_bound_a_tenant_waits_in_its_own_queue_then_gets_429():
    async def run():
        queues = TenantQueues("requests")
        release = await queues.enter("a", 1, max_waiting=1, wait_s=5)
        waiter = asyncio.create_task(queues.enter("a", 1, max_waiting=1, wait_s=5))
        await asyncio.sleep(0)
        with pytest.raises(APIError) as caught:  # one waiting already: refused at once
            await queues.enter("a", 1, max_waiting=1, wait_s=5)
        assert caught.value.status == 429 and "in flight" in caught.value.message
        other = await asyncio.wait_for(queues.enter("b", 1, max_waiting=0, wait_s=5), 1)  # apart
        release()
        release()  # once only
        second = await asyncio.wait_for(waiter, 1)  # the waiter got the place
        with pytest.raises(APIError):  # nobody may wait: refused at once
            await asyncio.wait_for(queues.enter("b", 1, max_waiting=0, wait_s=5), 1)
        with pytest.raises(APIError):  # waited its time
            await queues.enter("a", 1, max_waiting=4, wait_s=0.05)
        second()
        other()
        assert await queues.enter("anyone", None, 0, 1) is not None  # no bound
    asyncio.run(run())


def test_full_vocab_positions_cost_their_weight():
    assert request_tokens(10, 0, TenantLimits()) == 10
    assert request_tokens(10, 9, TenantLimits(full_vocab_token_weight=100)) == 10 + 9 * 99


def test_durations_in_openai_format():
    assert [duration(s) for s in (0, 0.2, 59.5, 60, 361)] == ["0s", "1s", "1m0s", "1m0s", "6m1s"]


def test_usage_counts_served_requests_tokens_and_every_status():
    async def run():
        usage = MemoryUsage()
        served = RequestRecord(request_id="1", method="POST", tenant="a", status=200, prompt_tokens=5,
                               scored_tokens=5, generated_tokens=2, full_vocab_bytes=100)
        refused_record = RequestRecord(request_id="2", method="POST", tenant="a", status=429, prompt_tokens=7)
        for record in (served, refused_record, served):
            await usage.add("a", counts(record))
        body = usage_body("a", await usage.read("a"))
        assert body == {"object": "usage", "tenant": "a", "requests": {"200": 2, "429": 1},
                        "prompt_tokens": 10, "scored_tokens": 10, "generated_tokens": 4,
                        "full_vocab_bytes": 200}
        assert usage_body("b", await usage.read("b"))["requests"] == {}
    asyncio.run(run())

