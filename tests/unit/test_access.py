import asyncio

import pytest

from serve_app.config import TenancyConfig
from serve_app.errors import APIError
from serve_app.observe.request_log import RequestRecord
from serve_app.tenants.access import Access
from serve_app.tenants.keyring import KeyFile, Tenant, TenantLimits, create_key, new_secret


def access_with_keys(tmp_path) -> tuple[Access, dict[str, str]]:
    secret_file, key_file = tmp_path / "secret", tmp_path / "keys.yaml"
    secret_file.write_text(new_secret())
    limits = TenantLimits(requests_per_minute=2, tokens_per_minute=50, max_in_flight=1, max_waiting=0)
    keys, made = KeyFile(tenants={"a": Tenant(limits=limits)}), {}
    for tenant in ("a", "b"):
        keys, made[tenant] = create_key(keys, tenant, secret_file.read_text().strip().encode())
    keys.write(key_file)
    config = TenancyConfig(key_file=str(key_file), secret_file=str(secret_file))
    return Access(config, retry_after_s=1), made


def record() -> RequestRecord:
    return RequestRecord(request_id="r", method="POST")


def finish(done: RequestRecord, status: int = 200) -> None:
    done.status = status
    for action in done.on_finish:
        action()


def test_admission_in_order_and_what_is_counted_once_over(tmp_path):
    async def run():
        access, made = access_with_keys(tmp_path)
        with pytest.raises(APIError) as caught:
            await access.admit(None, record())
        assert caught.value.code == "missing_api_key"
        first = record()
        tenant = await access.admit(f"Bearer {made['a']}", first)
        assert first.tenant == "a" and tenant.limits.max_in_flight == 1
        assert first.response_headers["x-ratelimit-remaining-requests"] == "1"
        second = record()
        with pytest.raises(APIError) as caught:  # one in flight already, and none may wait
            await access.admit(f"Bearer {made['a']}", second)
        assert caught.value.status == 429 and "in flight" in caught.value.message
        first.prompt_tokens = 40
        await access.charge_prompt(tenant, first, full_vocab_positions=0)
        assert first.response_headers["x-ratelimit-remaining-tokens"] == "10"
        first.generated_tokens = 3
        finish(first)
        finish(second, 429)
        await asyncio.gather(*access.pending)
        usage = await access.usage.read("a")
        assert usage == {"requests_200": 1, "requests_429": 1, "prompt_tokens": 40, "generated_tokens": 3}
        with pytest.raises(APIError) as caught:  # the request rate: 2 a minute
            await access.admit(f"Bearer {made['a']}", record())
        assert caught.value.code == "rate_limit_exceeded"
        unlimited = record()
        await access.admit(f"Bearer {made['b']}", unlimited)
        assert unlimited.response_headers == {}
    asyncio.run(run())


def test_without_a_key_file_every_request_is_one_unlimited_tenant():
    async def run():
        access = Access(TenancyConfig(), retry_after_s=1)
        admitted = record()
        tenant = await access.admit(None, admitted)
        assert admitted.tenant == "" and tenant.allows("any model") and admitted.response_headers == {}
    asyncio.run(run())


def test_a_batch_line_is_admitted_as_its_tenant_s_own_requests_are(tmp_path):
    async def run():
        access, _ = access_with_keys(tmp_path)
        line = record()
        tenant = await access.admit_named("a", line)
        assert line.tenant == "a" and tenant.limits.max_in_flight == 1
        with pytest.raises(APIError) as caught:  # its in-flight bound holds for batch lines too
            await access.admit_named("a", record())
        assert caught.value.status == 429
        with pytest.raises(APIError) as caught:
            await access.admit_named("gone", record())
        assert (caught.value.status, caught.value.code) == (403, "tenant_removed")
    asyncio.run(run())
