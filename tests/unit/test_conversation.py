"""Conversations scored on /v1/chat/completions, and the tokenizer endpoints' options."""

import math

import numpy as np
import pytest

from serve_app.api import admission, chat, tokenize
from serve_app.api.conversation import final_message_text, final_message_tokens, render_chat
from serve_app.api.request_models import ChatRequest, TokenizeRequest, parse_request
from serve_app.engine.wire import Caller, Completion, EngineResult
from serve_app.errors import APIError
from tests.unit.fakes import char_vocabulary, positions
from tests.unit.test_admission import CAPS as COMPLETION_CAPS
from tests.unit.test_admission import INGRESS

# Trims each text, as Llama 3's template does; the assistant's opening only when asked.
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] | trim }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}{{ suffix | default('') }}")
VOCAB = char_vocabulary("abcdé€ xyz<>ritenus", specials=("<end>",), chat_template=TEMPLATE)
CALLER = Caller("acme", 0)
# A conversation renders to 34 tokens here: the final message's 3 and what follows fit.
CAPS = COMPLETION_CAPS.model_copy(update={"max_model_len": 64, "max_scored_tokens": 20})
REPLY = [{"role": "user", "content": "abc"}, {"role": "assistant", "content": " xyz "}]


def chat_request(messages=REPLY, **fields) -> ChatRequest:
    body = {"model": "m", "messages": messages, "max_tokens": 1, **fields}
    return parse_request(ChatRequest, body, admission.rules(CAPS, INGRESS, chat=True))


def admit(messages=REPLY, **fields):
    return admission.admit_chat(chat_request(messages, **fields), CAPS, INGRESS, VOCAB, CALLER)


def refusal(**fields) -> tuple[str, str]:
    with pytest.raises(APIError) as caught:
        admit(**fields)
    return caught.value.param, caught.value.code


def test_the_final_message_is_found_where_the_template_writes_it():
    request = chat_request()
    prompt = render_chat(request.messages, VOCAB, request)
    assert prompt.text == "<user>abc<assistant>xyz<assistant>"
    text = final_message_text(request.messages, VOCAB, request, prompt.text)
    # The template trimmed the leading space: offsets still count in the text as sent.
    assert (prompt.text[text.start:text.end], text.lead) == ("xyz", 1)
    tokens = final_message_tokens(request.messages, VOCAB, request, prompt)
    assert [prompt.token_ids[p] for p in tokens.positions] == VOCAB.encode("xyz", False)[0]
    assert (tokens.pieces.tokens, tokens.pieces.offsets) == (["x", "y", "z"], [1, 2, 3])


def test_a_reply_that_also_appears_in_the_template_is_the_reply():
    """"a" is in "<assistant>", before and after the reply: only the reply's own place counts."""
    request = chat_request([{"role": "user", "content": "a"}, {"role": "assistant", "content": "a"}])
    prompt = render_chat(request.messages, VOCAB, request)
    tokens = final_message_tokens(request.messages, VOCAB, request, prompt)
    assert list(tokens.positions) == [len("<user>a<assistant>")]


def test_a_continued_message_ends_the_prompt():
    request = chat_request(continue_final_message=True)
    prompt = render_chat(request.messages, VOCAB, request)
    assert prompt.text == "<user>abc<assistant>xyz"
    assert list(final_message_tokens(request.messages, VOCAB, request, prompt).positions) == [20, 21, 22]


def test_template_variables_reach_the_template():
    request = chat_request(chat_template_kwargs={"suffix": "zz"})
    assert render_chat(request.messages, VOCAB, request).text.endswith("<assistant>zz")
    # A value is text, never more template.
    request = chat_request(chat_template_kwargs={"suffix": "{{ 1 }}"})
    assert render_chat(request.messages, VOCAB, request).text.endswith("<assistant>{{ 1 }}")


def test_a_template_that_drops_the_final_message_is_refused():
    dropping = char_vocabulary("abcxyz<>userasint", chat_template="{% for m in messages %}<{{ m['role'] }}>"
                               "{% endfor %}")
    request = chat_request(score_final_message=True)
    with pytest.raises(APIError) as caught:
        admission.admit_chat(request, CAPS, INGRESS, dropping, CALLER)
    assert (caught.value.param, caught.value.code) == ("score_final_message", "final_message_not_found")


def test_a_template_that_refuses_the_messages_is_a_refusal():
    refusing = char_vocabulary("abc", chat_template="{{ raise_exception('roles must alternate') }}")
    with pytest.raises(APIError) as caught:
        admission.admit_chat(chat_request(), CAPS, INGRESS, refusing, CALLER)
    assert (caught.value.param, caught.value.code) == ("messages", "chat_template_error")
    assert "roles must alternate" in caught.value.message


@pytest.mark.parametrize("fields, param, code", [
    ({"continue_final_message": True, "add_generation_prompt": True}, "continue_final_message",
     "invalid_combination"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs", "invalid_chat_template_kwargs"),
    ({"stream": True, "score_final_message": True}, "stream", "invalid_combination"),
    ({"stream": True, "echo": True}, "stream", "invalid_combination"),
    ({"stream": True, "prompt_logprobs": 0}, "stream", "invalid_combination"),
    ({"prompt_logprobs": -1, "logprob_start_len": 2}, "logprob_start_len", "invalid_combination"),
    ({"prompt_logprobs": 6}, "prompt_logprobs", "invalid_request"),
    ({"prompt_logprobs": 1, "logprob_token_ids": [1]}, "prompt_logprobs", "invalid_combination"),
    ({"logprob_start_len": 34}, "logprob_start_len", "invalid_request"),
    ({"echo": True}, "messages", "too_many_scored_tokens"),  # 34 tokens, CAPS scores 20
    ({"prompt_logprobs": -1}, "messages", "full_vocab_prompt_too_long"),
])
def test_chat_scoring_refusals(fields, param, code):
    assert refusal(**fields) == (param, code)


@pytest.mark.parametrize("fields, rows_from, k", [
    ({}, 0, None),
    ({"score_final_message": True}, 20, 0),
    ({"score_final_message": True, "top_logprobs": 3}, 20, 3),
    ({"score_final_message": True, "logprob_token_ids": [1, 2]}, 20, 0),  # labels in place of a top-k
    ({"logprob_start_len": 22}, 22, 0),
    ({"logprob_start_len": 22, "score_final_message": True, "top_logprobs": 2}, 20, 2),
    ({"logprob_start_len": 22, "prompt_logprobs": 4, "score_final_message": True}, 20, 4),
])
def test_the_engine_scores_from_the_first_position_shown(fields, rows_from, k):
    admitted = admit(**fields)
    (request,) = admitted.engine_requests
    assert (request.prompt_rows_from, request.prompt_logprobs) == (rows_from, k)
    length = len(admitted.prompts[0].token_ids)
    assert admitted.scored_tokens == (0 if k is None else length - rows_from)


def scored_result(admitted, generated: list[int]) -> EngineResult:
    """Prompt position p scores its token with logprob -p/10 at rank p, then two candidates."""
    prompt = admitted.prompts[0].token_ids
    rows = [None] + [[(t, -p / 10, p), (0, -0.5, 1), (1, -0.75, 2)] for p, t in enumerate(prompt) if p]
    completion = Completion(0, np.array(generated, np.int32), "".join(VOCAB.token(t) for t in generated),
                            "length", positions(*[[(t, -0.5, 1), (0, -0.01, 1)] for t in generated]))
    return EngineResult(np.array(prompt, np.int32), positions(*rows), [completion])


def test_the_final_message_s_tokens_with_their_pieces_ranks_and_sum():
    admitted = admit(score_final_message=True, top_logprobs=1)
    request = chat_request(score_final_message=True, top_logprobs=1)
    body = chat.chat_response("m", admitted, scored_result(admitted, [0]), request, VOCAB)
    final = body["final_message_logprobs"]
    assert final["role"] == "assistant"
    fields = [(t["token"], t["token_id"], t["text_offset"], t["logprob"], t["rank"])
              for t in final["content"]]
    assert fields == [(piece, VOCAB.encode(piece, False)[0][0], offset, pytest.approx(-position / 10),
                       position)
                      for piece, offset, position in zip("xyz", [1, 2, 3], [20, 21, 22], strict=True)]
    top = [{"token": "a", "logprob": -0.5, "bytes": [97]}]
    assert [t["top_logprobs"] for t in final["content"]] == [top] * 3
    assert final["logprob_sum"] == pytest.approx(math.fsum(-p / 10 for p in (20, 21, 22)))
    assert "prompt_logprobs" not in body


def test_prompt_logprobs_from_the_span_s_start_and_echo_of_the_same_role():
    fields = {"logprob_start_len": 21, "echo": True, "add_generation_prompt": False}
    admitted, request = admit(**fields), chat_request(**fields)
    body = chat.chat_response("m", admitted, scored_result(admitted, [0]), request, VOCAB)
    rows = body["prompt_logprobs"]
    assert len(rows) == len(admitted.prompts[0].token_ids)
    assert rows[:21] == [None] * 21
    assert [list(row) for row in rows[21:]] == [[str(t)] for t in admitted.prompts[0].token_ids[21:]]
    # The answer continues the final (assistant) message: echo puts its text first.
    assert body["choices"][0]["message"] == {"role": "assistant", "content": " xyz a"}


def test_echo_adds_nothing_after_the_assistant_s_opening_of_another_role():
    messages = [{"role": "user", "content": "abc"}]
    admitted, request = admit(messages, echo=True), chat_request(messages, echo=True)
    body = chat.chat_response("m", admitted, scored_result(admitted, [0]), request, VOCAB)
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "a"}
    assert body["prompt_logprobs"][0] is None and len(body["prompt_logprobs"]) == 20


def tokenize_request(**body) -> TokenizeRequest:
    return parse_request(TokenizeRequest, {"model": "m", **body}, {})


def test_tokenize_renders_as_chat_does_and_names_the_tokens():
    request = tokenize_request(messages=REPLY, continue_final_message=True, return_token_strs=True)
    body = tokenize.tokenize_response(request, VOCAB, 32)
    assert body["tokens"] == render_chat(chat_request(continue_final_message=True).messages, VOCAB,
                                         request).token_ids
    assert body["token_strs"] == [VOCAB.tokenizer.convert_ids_to_tokens(t) for t in body["tokens"]]
    assert (body["count"], body["max_model_len"]) == (len(body["tokens"]), 32)
    assert "token_strs" not in tokenize.tokenize_response(tokenize_request(prompt="ab"), VOCAB, 32)


@pytest.mark.parametrize("field, value", [("add_generation_prompt", False),
                                          ("continue_final_message", False),
                                          ("chat_template_kwargs", {})])
def test_template_options_belong_to_messages(field, value):
    with pytest.raises(APIError) as caught:
        tokenize.tokenize(tokenize_request(prompt="ab", **{field: value}), VOCAB)
    assert (caught.value.param, caught.value.code) == (field, "invalid_combination")


def test_tokenizer_info_is_the_configuration_without_the_server_s_paths():
    model = char_vocabulary("ab", specials=("<end>",), chat_template=TEMPLATE)
    model.tokenizer.eos_token = "<end>"
    model.tokenizer.init_kwargs["name_or_path"] = "/srv/models/secret"
    info = tokenize.tokenizer_info(model, 512)
    assert (info["eos_token"], info["model_max_length"], info["chat_template"]) == ("<end>", 512, TEMPLATE)
    assert info["tokenizer_class"] == type(model.tokenizer).__name__
    assert "name_or_path" not in info
