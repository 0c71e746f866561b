import numpy as np
import orjson

from serve_app.api import admission
from serve_app.api.request_models import CompletionRequest, completion_rules, parse_request
from serve_app.api.streaming import DONE, CompletionStream
from serve_app.engine.wire import Completion, EngineResult
from tests.unit.fakes import char_vocabulary, positions

VOCAB = char_vocabulary("abcdé€ xyz")


def stream_for(**fields) -> CompletionStream:
    body = parse_request(CompletionRequest, {"model": "m", "prompt": "ab", "stream": True, **fields},
                         completion_rules(5, 4, 8))
    prompts = admission.prompt_inputs(body.prompt, VOCAB, 8)
    return CompletionStream("m", body, prompts, VOCAB)


def delta(index: int, token_ids: list[int], finish: str | None = None) -> EngineResult:
    rows = [[(t, -1.0, 1)] for t in token_ids]
    completion = Completion(index, np.array(token_ids, np.int32), VOCAB.decode(token_ids), finish,
                            positions(*rows))
    return EngineResult(np.array([0, 1], np.int32), None, [completion])


def payloads(chunks: list[bytes]) -> list[dict]:
    return [orjson.loads(chunk.removeprefix(b"data: ")) for chunk in chunks]


def test_offsets_continue_across_chunks():
    stream = stream_for(logprobs=0)
    first = payloads(stream.events(0, delta(0, [4, 5])))[0]["choices"][0]
    second = payloads(stream.events(0, delta(0, [6], "length")))[0]["choices"][0]
    assert first["text"] == "é€" and first["logprobs"]["text_offset"] == [0, 1]
    assert second["logprobs"]["text_offset"] == [2]
    assert second["finish_reason"] == "length"


def test_a_greedy_sample_feeds_all_n_choices():
    stream = stream_for(temperature=0, n=3, prompt=["ab", "ba"])
    indices = [p["choices"][0]["index"] for p in payloads(stream.events(1, delta(0, [1])))]
    assert indices == [3, 4, 5]


def test_sampled_choices_keep_their_index():
    stream = stream_for(n=2)
    (event,) = payloads(stream.events(0, delta(1, [2])))
    assert event["choices"][0]["index"] == 1 and event["object"] == "text_completion"


def test_usage_comes_last_when_asked():
    stream = stream_for(n=2, stream_options={"include_usage": True})
    stream.events(0, delta(0, [1, 2]))
    stream.events(0, delta(1, [3]))
    usage_event, done = stream.closing_events()
    assert done == DONE
    usage = orjson.loads(usage_event.removeprefix(b"data: "))
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    assert stream_for().closing_events() == [DONE]
