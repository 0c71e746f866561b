"""The documented rules of `tokens` and `text_offset` (docs/api.md, serve_app/text/pieces.py),
checked on a response: the pieces partition the text exactly."""

SAMPLES = {
    "ascii": "The capital of France is Paris.",
    "accented": "Déjà vu: naïve café, Ærøskøbing.",
    "cjk": "東京は日本の首都です。",
    "emoji": "Ship it 🚀🎉 now 👍🏽!",
}


def assert_pieces(text: str, tokens: list[str], offsets: list[int], token_ids: list[int],
                  special_ids: set[int], names: dict[int, str]) -> None:
    """Every piece sits at its offset; the pieces join into the text; a special token the
    text does not hold takes no room and is named."""
    assert len(tokens) == len(offsets) == len(token_ids)
    ends = offsets[1:] + [len(text)]
    joined = ""
    for token, token_id, start, end in zip(tokens, token_ids, offsets, ends, strict=True):
        assert start <= end, (tokens, offsets)
        if token_id in special_ids and text[start:end] != token:
            assert start == end and token == names[token_id], (token, start, end)
            continue
        assert text[start:end] == token, (text[start:end], token, tokens)
        joined += token
    assert joined == text[offsets[0]:] if offsets else text == ""


def special_tokens(tokenizer) -> tuple[set[int], dict[int, str]]:
    decoder = tokenizer.added_tokens_decoder
    return ({i for i, t in decoder.items() if t.special},
            {i: t.content for i, t in decoder.items()})
