import numpy as np
import orjson
import pytest

from serve_app.api import admission, chat, tokenize
from serve_app.api.admission import Admitted
from serve_app.api.conversation import render_chat
from serve_app.api.request_models import ChatRequest, DetokenizeRequest, TokenizeRequest, parse_request
from serve_app.api.streaming import ChatStream
from serve_app.engine.wire import Completion, EngineResult
from serve_app.errors import APIError
from tests.unit.fakes import char_vocabulary, positions
from tests.unit.test_admission import CAPS, INGRESS

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
VOCAB = char_vocabulary("abcdé€ xyz<>ritenus", specials=("<end>",), chat_template=TEMPLATE)
END = VOCAB.size - 1
MESSAGES = [{"role": "user", "content": "abc"}]


def chat_request(**fields) -> ChatRequest:
    body = {"model": "m", "messages": MESSAGES, **fields}
    request = parse_request(ChatRequest, body, admission.rules(CAPS, INGRESS, chat=True))
    admission.check_chat(request, CAPS, INGRESS, VOCAB)
    return request


def generated(token_ids: list[int], finish: str = "stop") -> Completion:
    rows = [[(t, -0.5, 1), (0, -1.0, 1), (1, -2.0, 2)] for t in token_ids]
    text = "".join(VOCAB.token(t) for t in token_ids if t != END)
    return Completion(0, np.array(token_ids, np.int32), text, finish, positions(*rows))


def chat_prompt(request: ChatRequest, vocab=VOCAB):
    return render_chat(request.messages, vocab, request)


def respond(request: ChatRequest, completion: Completion) -> dict:
    prompt = chat_prompt(request)
    result = EngineResult(np.array(prompt.token_ids, np.int32), None, [completion])
    return chat.chat_response("m", Admitted([prompt], []), result, request, VOCAB)


def test_messages_are_rendered_with_the_template():
    prompt = chat_prompt(chat_request())
    assert prompt.text == "<user>abc<assistant>"
    assert prompt.token_ids == VOCAB.encode(prompt.text, add_special_tokens=False)[0]


def test_the_chat_completion_object():
    body = respond(chat_request(logprobs=True, top_logprobs=2), generated([4, 5, END]))
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": "é€"}
    content = choice["logprobs"]["content"]
    assert [e["token"] for e in content] == ["é", "€", "<end>"]
    assert [e["bytes"] for e in content] == [list("é".encode()), list("€".encode()), None]
    assert content[0]["top_logprobs"] == [{"token": "a", "logprob": -1.0, "bytes": [97]},
                                          {"token": "b", "logprob": -2.0, "bytes": [98]}]
    assert body["usage"] == {"prompt_tokens": 20, "completion_tokens": 3, "total_tokens": 23}
    assert body["object"] == "chat.completion"


def test_logprobs_are_off_unless_asked():
    assert respond(chat_request(), generated([4]))["choices"][0]["logprobs"] is None
    top_zero = respond(chat_request(logprobs=True), generated([4]))["choices"][0]["logprobs"]
    assert top_zero["content"][0]["top_logprobs"] == []


def test_labels_are_listed_in_the_order_asked():
    request = chat_request(logprob_token_ids=[0, 1])
    entry = respond(request, generated([4]))["choices"][0]["logprobs"]["content"][0]
    assert [t["token"] for t in entry["top_logprobs"]] == ["a", "b"]


@pytest.mark.parametrize("fields, param, code", [
    ({"top_logprobs": 6}, "top_logprobs", "invalid_request"),
    ({"max_tokens": 2, "max_completion_tokens": 3}, "max_completion_tokens", "invalid_combination"),
    ({"logprob_token_ids": [1], "top_logprobs": 1}, "top_logprobs", "invalid_combination"),
])
def test_chat_refusals(fields, param, code):
    with pytest.raises(APIError) as caught:
        chat_request(**fields)
    assert (caught.value.param, caught.value.code) == (param, code)


def test_no_template_no_chat():
    plain = char_vocabulary("abc")
    with pytest.raises(APIError) as caught:
        chat_prompt(chat_request(), plain)
    assert (caught.value.param, caught.value.code) == ("model", "no_chat_template")


def test_a_stream_sends_the_role_first_and_the_pieces_in_order():
    request = chat_request(stream=True, logprobs=True)
    stream = ChatStream("m", request, [chat_prompt(request)], VOCAB)
    first = generated([4], finish=None)
    events = stream.events(0, EngineResult(np.array([0]), None, [first]))
    events += stream.events(0, EngineResult(np.array([0]), None, [generated([5, END])]))
    chunks = [orjson.loads(e.removeprefix(b"data: "))["choices"][0] for e in events]
    assert chunks[0]["delta"] == {"role": "assistant", "content": "é"}
    assert chunks[1]["delta"] == {"content": "€"}
    assert [e["token"] for c in chunks for e in c["logprobs"]["content"]] == ["é", "€", "<end>"]


def test_tokenize_a_prompt_or_messages():
    def parse(kind, **body):
        return parse_request(kind, {"model": "m", **body}, {})
    assert tokenize.tokenize(parse(TokenizeRequest, prompt="abc"), VOCAB) == [0, 1, 2]
    rendered = tokenize.tokenize(parse(TokenizeRequest, messages=MESSAGES), VOCAB)
    assert rendered == chat_prompt(chat_request()).token_ids
    assert tokenize.detokenize(parse(DetokenizeRequest, tokens=[4, 5, END]), VOCAB) == "é€<end>"
    for body in ({}, {"prompt": "a", "messages": MESSAGES}):
        with pytest.raises(APIError):
            tokenize.tokenize(parse(TokenizeRequest, **body), VOCAB)
