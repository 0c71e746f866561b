"""Request ids and the request log: every response carries `x-request-id` (the client's own
when well formed), and the ingress logs one JSON line per request, with no prompt text."""

import time
import uuid
from pathlib import Path

import orjson
import ray

from serve_app.observe.request_log import well_formed_request_id
from tests.e2e.conftest import MODEL

LOG_WAIT_S = 20


def session_logs() -> list:
    """The session service's Ray logs: its own session's folder, not `session_latest`, which
    any later Ray start under the same PROBSERVE_HOME takes over."""
    logs = ray._private.worker._global_node.get_logs_dir_path()
    return sorted(Path(logs).rglob("*"))


def request_lines(ids: set[str]) -> list[dict]:
    """The request log's lines for these ids, from every log file of the Ray session."""
    lines = []
    for path in session_logs():
        if path.is_file():
            for line in path.read_bytes().splitlines():
                if line.startswith(b'{"event":"request"') and any(i.encode() in line for i in ids):
                    lines.append(orjson.loads(line))
    return lines


def test_request_ids_round_trip_and_each_request_is_logged_once_without_its_text(http):
    secret = f"confidential-{uuid.uuid4().hex}"
    own = {f"client-{i}-{uuid.uuid4().hex[:8]}" for i in range(3)}
    usage = {}
    for request_id in own:
        response = http.post("/v1/completions", headers={"x-request-id": request_id},
                             json={"model": MODEL, "prompt": f"{secret} says hello", "max_tokens": 2})
        assert response.status_code == 200, response.text
        assert response.headers.get_list("x-request-id") == [request_id]
        usage[request_id] = response.json()["usage"]
    refused = http.post("/v1/completions", headers={"x-request-id": "not a good id"},
                        json={"model": MODEL, "prompt": secret, "max_tokens": -1})
    replaced = refused.headers["x-request-id"]
    assert refused.status_code == 400 and replaced != "not a good id"
    assert well_formed_request_id(replaced.encode())

    ids = own | {replaced}
    deadline = time.monotonic() + LOG_WAIT_S
    while len(lines := request_lines(ids)) < len(ids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert sorted(line["request_id"] for line in lines) == sorted(ids)
    by_id = {line["request_id"]: line for line in lines}
    assert by_id[replaced]["status"] == 400 and by_id[replaced]["code"] == "invalid_request"
    for request_id in own:
        line = by_id[request_id]
        assert (line["endpoint"], line["model"], line["status"], line["code"]) == \
            ("/v1/completions", MODEL, 200, "")
        assert line["prompt_tokens"] == usage[request_id]["prompt_tokens"]
        assert line["generated_tokens"] == usage[request_id]["completion_tokens"]
        assert 0 < line["time_to_first_byte_s"] <= line["duration_s"]
    for path in session_logs():
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"{path} holds prompt text"
