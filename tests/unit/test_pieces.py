"""Pieces and offsets on each tokenizer family, trained in memory as the model store does."""

import pytest
from transformers import PreTrainedTokenizerFast

from serve_app.store.model_store import TINY, TINY_BOS, TINY_FAMILIES, TINY_SENTENCEPIECE, family_tokenizer
from serve_app.text.pieces import GeneratedPieces, id_prompt_pieces, string_pieces
from serve_app.text.vocabulary import Vocabulary

TEXTS = ["Hello world", "Déjà vu, naïve café", "東京は日本の首都", "Ship it 🚀🎉 👍🏽!", "  two  spaces "]


@pytest.fixture(scope="module", params=[TINY, TINY_BOS, TINY_SENTENCEPIECE])
def vocab(request) -> Vocabulary:
    family = TINY_FAMILIES[request.param]
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=family_tokenizer(family), **family.fast_tokenizer)
    return Vocabulary(tokenizer, len(tokenizer))


def assert_partition(text: str, tokens: list[str], offsets: list[int], token_ids: list[int],
                     vocab: Vocabulary) -> None:
    ends = offsets[1:] + [len(text)]
    kept = []
    for token, token_id, start, end in zip(tokens, token_ids, offsets, ends):
        if token_id in vocab.special_ids and start == end:
            assert token == vocab.token(token_id)  # named, no room taken
            continue
        assert text[start:end] == token
        kept.append(token)
    assert "".join(kept) == text


@pytest.mark.parametrize("text", TEXTS)
def test_a_string_prompt_is_partitioned_as_sent(vocab, text):
    token_ids, spans = vocab.encode(text)
    pieces = string_pieces(text, spans, token_ids, vocab)
    assert_partition(text, pieces.tokens, pieces.offsets, token_ids, vocab)


@pytest.mark.parametrize("text", TEXTS)
def test_token_ids_read_as_the_tokenizer_decodes_them(vocab, text):
    token_ids = vocab.encode(text)[0]
    pieces = id_prompt_pieces(token_ids, vocab)
    decoded = "".join(pieces.tokens)
    assert decoded == vocab.decode(token_ids)
    assert_partition(decoded, pieces.tokens, pieces.offsets, token_ids, vocab)


def test_a_token_inside_a_character_is_empty_at_its_start(vocab):
    text = "a🚀"
    token_ids, spans = vocab.encode(text, add_special_tokens=False)
    pieces = string_pieces(text, spans, token_ids, vocab)
    assert pieces.tokens[-1] == "🚀" and set(pieces.tokens[1:-1]) <= {""}
    assert pieces.offsets[1:] == [1] * (len(token_ids) - 1)


def test_generated_pieces_continue_across_deltas_and_name_special_tokens(vocab):
    prompt = vocab.encode("Hello")[0]
    generated = vocab.encode(" world 🚀 done", add_special_tokens=False)[0]
    end = sorted(vocab.special_ids)[-1]
    whole = GeneratedPieces(vocab, prompt, base=5).add(generated + [end])
    split = GeneratedPieces(vocab, prompt, base=5)
    first, second = split.add(generated[:3]), split.add(generated[3:] + [end])
    assert first.tokens + second.tokens == whole.tokens
    assert first.offsets + second.offsets == whole.offsets
    assert_partition(" world 🚀 done", whole.tokens, [o - 5 for o in whole.offsets],
                     generated + [end], vocab)


def test_a_stop_string_cuts_the_pieces_where_the_text_ends(vocab):
    generated = vocab.encode(" world wide", add_special_tokens=False)[0]
    pieces = GeneratedPieces(vocab, vocab.encode("Hello")[0]).add(generated, text_end=4)
    assert "".join(pieces.tokens) == " wor"
    assert max(pieces.offsets) <= 4


def test_invalid_utf8_from_byte_tokens_restarts_the_stream():
    """A byte token that starts no valid character makes the decoded prefix shrink ('o'
    becomes part of '\ufffd\ufffd'), which tokenizers' stream refuses; the pieces restart as
    vLLM's detokenizer restarts its text."""
    family = TINY_FAMILIES[TINY_SENTENCEPIECE]
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=family_tokenizer(family), **family.fast_tokenizer)
    vocab = Vocabulary(tokenizer, len(tokenizer))
    noisy = tokenizer.convert_tokens_to_ids(["<0x6F>", "<0xF0>", "▁the"])
    # After the restart, "▁the" starts a text: its space goes, as it goes from vLLM's text.
    assert GeneratedPieces(vocab, []).add(noisy).tokens == ["o", "", "the"]
    assert id_prompt_pieces(noisy, vocab).tokens == ["o", "", "the"]
