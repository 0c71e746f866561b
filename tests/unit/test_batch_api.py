"""The Files and Batches endpoints' storage reads: each for the tenant the caller is admitted
as, with the endpoint's own arguments after it (serve_app.front.batch_api.storage_read)."""

import asyncio
from types import SimpleNamespace

import orjson
import pytest

from serve_app.config import BatchConfig, IngressConfig
from serve_app.errors import APIError
from serve_app.front.batch_api import BatchAPI


class Pipeline:
    """Admits each request as the tenant its `tenant` attribute names, counting admissions."""

    config = SimpleNamespace(ingress=IngressConfig())

    def __init__(self):
        self.admitted = []

    async def tenant_name(self, request) -> str:
        self.admitted.append(request.tenant)
        return request.tenant


def as_tenant(name: str) -> SimpleNamespace:
    return SimpleNamespace(tenant=name)


@pytest.fixture
def api(tmp_path) -> BatchAPI:
    api = BatchAPI(BatchConfig(storage=str(tmp_path)), Pipeline(), observer=None, runner=None)
    file_id, partial = api.storage.new_file("alpha")
    partial.write_bytes(b"{}\n")
    api.file_id = api.storage.record_file("alpha", file_id, partial, "in.jsonl", "batch")["id"]
    return api


def body(response) -> dict:
    return orjson.loads(response.body)


def test_a_read_is_for_the_admitted_tenant_with_the_endpoint_s_arguments(api):
    listed = asyncio.run(api.files(as_tenant("alpha"), "batch"))
    assert [f["id"] for f in body(listed)["data"]] == [api.file_id]
    assert body(asyncio.run(api.files(as_tenant("alpha"), "batch_output")))["data"] == []
    assert body(asyncio.run(api.file(as_tenant("alpha"), api.file_id)))["filename"] == "in.jsonl"
    assert api.pipeline.admitted == ["alpha"] * 3


def test_another_tenant_reads_nothing_of_it(api):
    assert body(asyncio.run(api.files(as_tenant("beta"), None)))["data"] == []
    with pytest.raises(APIError) as missing:
        asyncio.run(api.file(as_tenant("beta"), api.file_id))
    assert missing.value.code == "file_not_found"
    assert api.pipeline.admitted == ["beta", "beta"]
