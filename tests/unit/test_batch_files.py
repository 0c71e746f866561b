"""Files and batch records in storage, and uploads parsed as they arrive: each tenant's own,
ids that cannot leave their folder, records written whole, uploads bounded."""

import asyncio

import httpx
import orjson
import pytest

from serve_app.batch.storage import Storage, folder_tenant, tenant_folder
from serve_app.batch.upload import receive_upload
from serve_app.errors import APIError


@pytest.fixture
def storage(tmp_path):
    return Storage(tmp_path / "batch")


def stored_file(storage: Storage, tenant: str, data: bytes, name: str = "in.jsonl") -> dict:
    file_id, partial = storage.new_file(tenant)
    partial.write_bytes(data)
    return storage.record_file(tenant, file_id, partial, name, "batch")


@pytest.mark.parametrize("tenant", ["", "alpha", "a/b", "..", "tenant-x", "anonymous", "名前"])
def test_every_tenant_has_a_folder_of_its_own(tenant):
    folder = tenant_folder(tenant)
    assert "/" not in folder and folder not in (".", "..")
    assert folder_tenant(folder) == tenant


def test_a_file_reads_back_and_only_for_its_tenant(storage):
    record = stored_file(storage, "alpha", b'{"custom_id": "1"}\n')
    assert record["object"] == "file" and record["bytes"] == 19 and record["purpose"] == "batch"
    assert storage.file("alpha", record["id"]) == record
    assert storage.file_data("alpha", record["id"]).read_bytes() == b'{"custom_id": "1"}\n'
    for tenant in ("beta", ""):
        with pytest.raises(APIError) as refused:
            storage.file(tenant, record["id"])
        assert (refused.value.status, refused.value.code) == (404, "file_not_found")


@pytest.mark.parametrize("file_id", ["../../etc/passwd", "file-../x", "file-" + "g" * 32, ""])
def test_an_id_that_is_not_one_of_ours_is_not_found(storage, file_id):
    with pytest.raises(APIError) as refused:
        storage.file_data("alpha", file_id)
    assert refused.value.code == "file_not_found"


def test_files_are_listed_newest_first_and_deleted_whole(storage):
    first, second = stored_file(storage, "alpha", b"1\n"), stored_file(storage, "alpha", b"2\n")
    listed = [f["id"] for f in storage.files("alpha")]
    assert set(listed) == {first["id"], second["id"]}
    storage.delete_file("alpha", first["id"])
    assert [f["id"] for f in storage.files("alpha")] == [second["id"]]
    assert not list((storage.tenant_root("alpha") / "files").glob(f"{first['id']}*"))
    assert storage.files("nobody") == []


def test_batch_records_are_written_whole_and_found_for_resuming(storage):
    record = {"id": "batch_" + "a" * 32, "created_at": 1, "status": "in_progress"}
    storage.save_batch("alpha", record)
    storage.save_batch("", {**record, "id": "batch_" + "b" * 32})
    assert storage.batch("alpha", record["id"]) == record
    assert not [p for p in storage.root.rglob(".*")]  # no staging file left behind
    assert list(storage.batch_ids()) == [("", "batch_" + "b" * 32), ("alpha", record["id"])]
    with pytest.raises(APIError) as refused:
        storage.batch("beta", record["id"])
    assert (refused.value.status, refused.value.code) == (404, "batch_not_found")


def multipart(files=None, data=None) -> tuple[bytes, str]:
    request = httpx.Request("POST", "http://x/v1/files", files=files, data=data)
    return request.read(), request.headers["content-type"]


async def chunks_of(body: bytes, size: int = 7):
    for start in range(0, len(body), size):
        yield body[start:start + size]


def upload(body: bytes, content_type: str, target, limit: int = 1 << 20):
    return asyncio.run(receive_upload(chunks_of(body), content_type, target, limit))


def test_an_upload_goes_to_its_target_as_it_arrives(tmp_path):
    content = b"".join(orjson.dumps({"custom_id": str(i)}) + b"\n" for i in range(500))
    body, content_type = multipart(files={"file": ("lines.jsonl", content)}, data={"purpose": "batch"})
    received = upload(body, content_type, tmp_path / "target")
    assert received.fields == {"purpose": "batch"}
    assert (received.filename, received.size) == ("lines.jsonl", len(content))
    assert (tmp_path / "target").read_bytes() == content


def test_an_upload_past_its_cap_is_refused_without_writing_the_rest(tmp_path):
    body, content_type = multipart(files={"file": ("big.jsonl", b"x" * 5000)}, data={"purpose": "batch"})
    with pytest.raises(APIError) as refused:
        upload(body, content_type, tmp_path / "target", limit=1000)
    assert (refused.value.status, refused.value.code) == (413, "file_too_large")
    assert (tmp_path / "target").stat().st_size <= 1000


@pytest.mark.parametrize(("body", "content_type", "code"), [
    (b"{}", "application/json", "unsupported_media_type"),
    (b"--b\r\nno headers here", "multipart/form-data; boundary=b", "invalid_upload"),
    (b'--b\r\nContent-Disposition: attachment\r\n\r\nx\r\n--b--\r\n', "multipart/form-data; boundary=b",
     "invalid_upload"),
])
def test_a_body_that_is_not_an_upload_is_refused(tmp_path, body, content_type, code):
    with pytest.raises(APIError) as refused:
        upload(body, content_type, tmp_path / "target")
    assert refused.value.code == code


def test_two_files_in_one_upload_are_refused(tmp_path):
    body, content_type = multipart(files=[("file", ("a.jsonl", b"1")), ("file", ("b.jsonl", b"2"))])
    with pytest.raises(APIError) as refused:
        upload(body, content_type, tmp_path / "target")
    assert refused.value.code == "invalid_upload"
