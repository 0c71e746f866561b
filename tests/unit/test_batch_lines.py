"""A batch's lines and record: the input file checked as OpenAI checks it, request lines the
batch cannot send refused one by one, result lines in OpenAI's shape, what a restarted batch
already finished, and the record's steps and pages."""

import time

import orjson
import pytest

from serve_app.api.request_models import BatchRequest
from serve_app.batch import lines, records
from serve_app.errors import APIError

ENDPOINT = "/v1/completions"


def request(custom_id: str, **changes) -> bytes:
    line = {"custom_id": custom_id, "method": "POST", "url": ENDPOINT, "body": {"model": "m", "prompt": "x"}}
    return orjson.dumps({**line, **changes}) + b"\n"


def written(tmp_path, *rows: bytes):
    path = tmp_path / "input.jsonl"
    path.write_bytes(b"".join(rows))
    return path


def test_a_good_file_is_counted_and_blank_lines_skipped(tmp_path):
    path = written(tmp_path, request("a"), b"\n", request("b"), b"  \n")
    assert lines.check_input(path, max_lines=10) == (2, [])
    assert [number for number, _ in lines.lines_of(path)] == [1, 3]


@pytest.mark.parametrize(("rows", "code", "line"), [
    ([request("a"), b"{not json\n"], "invalid_json_line", 2),
    ([b"[1, 2]\n"], "invalid_json_line", 1),
    ([request("a"), orjson.dumps({"method": "POST"}) + b"\n"], "invalid_custom_id", 2),
    ([request("")], "invalid_custom_id", 1),
    ([request("a"), request("b"), request("a")], "duplicate_custom_id", 3),
    ([request(str(i)) for i in range(4)], "too_many_lines", None),
    ([b"\n"], "empty_file", None),
])
def test_a_file_no_custom_id_can_be_matched_in_fails_its_check(tmp_path, rows, code, line):
    _, errors = lines.check_input(written(tmp_path, *rows), max_lines=3)
    assert [(e["code"], e["line"]) for e in errors] == [(code, line)]


@pytest.mark.parametrize("changes", [{"method": "GET"}, {"url": "/v1/chat/completions"}, {"body": "x"}])
def test_a_line_the_batch_cannot_send_is_refused_with_an_envelope(changes):
    line = lines.request_line(1, request("a", **changes))
    refusal = lines.line_refusal(line, ENDPOINT)
    assert refusal["error"]["code"] == "invalid_batch_line"
    assert lines.line_refusal(lines.request_line(1, request("a")), ENDPOINT) is None


def test_result_lines_have_openai_s_shape():
    line = orjson.loads(lines.result_line("a", "req-1", 400, {"error": {"code": "x"}}))
    assert line["id"].startswith("batch_req_") and line["custom_id"] == "a" and line["error"] is None
    assert line["response"] == {"status_code": 400, "request_id": "req-1", "body": {"error": {"code": "x"}}}


def test_a_restarted_batch_skips_what_it_finished_and_drops_a_torn_line(tmp_path):
    path = tmp_path / "output.jsonl"
    assert lines.finished_ids(path) == set()
    whole = lines.result_line("a", "", 200, {}) + lines.result_line("b", "", 200, {})
    path.write_bytes(whole + lines.result_line("c", "", 200, {})[:20])
    assert lines.finished_ids(path) == {"a", "b"}
    assert path.read_bytes() == whole


def test_a_batch_record_steps_through_its_life():
    record = records.new_batch(BatchRequest(input_file_id="file-1", endpoint=ENDPOINT,
                                            completion_window="24h", metadata={"k": "v"}))
    assert record["status"] == "validating" and record["expires_at"] - record["created_at"] == 24 * 3600
    assert record["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    running = records.moved(record, "in_progress")
    assert running["in_progress_at"] >= record["created_at"] and not records.is_finished(running)
    records.cancellable(running)
    done = records.moved(running, "completed", output_file_id="file-2")
    assert records.is_finished(done) and done["output_file_id"] == "file-2"
    with pytest.raises(APIError) as refused:
        records.cancellable(done)
    assert (refused.value.status, refused.value.code) == (409, "batch_not_cancellable")
    assert not records.is_expired(record) and records.is_expired({**record, "expires_at": time.time() - 1})


def test_batches_page_by_cursor():
    listed = [{"id": f"batch_{i}"} for i in range(5)]
    first = records.page(listed, None, 2)
    assert [r["id"] for r in first["data"]] == ["batch_0", "batch_1"] and first["has_more"]
    last = records.page(listed, first["last_id"], 3)
    assert [r["id"] for r in last["data"]] == ["batch_2", "batch_3", "batch_4"] and not last["has_more"]
    assert records.page(listed, "batch_unknown", 2)["data"] == []
    with pytest.raises(APIError):
        records.page(listed, None, 0)
