"""Reading a server-sent event stream the way a client does."""

import orjson


def stream_events(http, path: str, body: dict) -> list[dict]:
    """The JSON events of a 200 stream, which must end with `data: [DONE]`."""
    with http.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)
    return [orjson.loads(line.removeprefix("data: ")) for line in lines[:-1]]
