"""A full-vocabulary response's JSON, as parts the relay streams (probserve.fullvocab.relay):
text as bytes, and in each choice's place of `prompt_logprobs` the list of its array's chunks,
which the serializer pool writes. The arrays are far too big to hold as one body."""

from collections.abc import Iterator

import orjson


def json_parts(response: dict, arrays: list[list]) -> Iterator[bytes | list]:
    """`response` with `prompt_logprobs` added last to choice i as `[null`, the chunks of
    `arrays[i]`, `]`: position 0, which nothing predicts, is null."""
    fields = list(response)
    at = fields.index("choices")
    head = members(response, fields[:at])
    text = b"{" + head + (b"," if head else b"") + b'"choices":['
    for index, (choice, chunks) in enumerate(zip(response["choices"], arrays, strict=True)):
        yield text + (b"," if index else b"") + orjson.dumps(choice)[:-1] + b',"prompt_logprobs":[null'
        yield chunks
        text = b"]}"
    tail = members(response, fields[at + 1:])
    yield text + b"]" + (b"," if tail else b"") + tail + b"}"


def members(response: dict, names: list[str]) -> bytes:
    """`"name":value,...` of those fields, without braces."""
    return orjson.dumps({name: response[name] for name in names})[1:-1]


def choice_arrays(results: list, n: int) -> list[list]:
    """Each choice's array chunks: the n choices of a prompt share its rows."""
    return [result.full_vocab.chunks for result in results for _ in range(n)]
