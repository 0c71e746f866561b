"""A full-vocabulary response's JSON, as parts the relay streams (serve_app.fullvocab.relay):
text as bytes, and in each place of `prompt_logprobs` its prompt's chunks as the replica
computes them, which the serializer pool writes. The arrays are far too big to hold as one
body, and `prompt_logprobs` comes first (in each choice of a completion, at the top of a chat
completion, as vLLM places them), so that its rows leave before the rest of the prompt is
computed: the other members follow once it is."""

from collections.abc import AsyncIterator, Callable

import orjson

from serve_app.engine.wire import EngineResult
from serve_app.fullvocab.streamed import StreamedRows, pieces_of


async def json_parts(head: dict, prompts: list[StreamedRows], n: int,
                     choices: Callable[[int, EngineResult], list[dict]],
                     usage: Callable[[list[EngineResult]], dict],
                     piece_positions: int) -> AsyncIterator[bytes | AsyncIterator]:
    """`head`'s members, then the n choices of each prompt: `"prompt_logprobs":[null`, its
    rows in pieces of `piece_positions`, `]`, then the choice's other members
    (`choices(prompt, result)`), and `usage(results)` last. Position 0, which nothing
    predicts, is null."""
    text = b"{" + orjson.dumps(head)[1:-1] + b',"choices":['
    for prompt, rows in enumerate(prompts):
        for j in range(n):
            index = prompt * n + j
            yield text + b'{"index":%d,"prompt_logprobs":[null' % index
            yield pieces_of(rows.parts(last_use=j == n - 1), piece_positions)
            members = {name: value for name, value in choices(prompt, rows.result())[j].items()
                       if name != "index"}
            yield b"]," + orjson.dumps(members)[1:]
            text = b","
    yield b'],"usage":' + orjson.dumps(usage([rows.result() for rows in prompts])) + b"}"


async def chat_json_parts(head: dict, rows: StreamedRows, members: Callable[[EngineResult], dict],
                          piece_positions: int) -> AsyncIterator[bytes | AsyncIterator]:
    """`head`'s members, `"prompt_logprobs":[null`, the conversation's rows in pieces of
    `piece_positions`, `]`, then `members(result)` (the choices, the usage, ...)."""
    yield b"{" + orjson.dumps(head)[1:-1] + b',"prompt_logprobs":[null'
    yield pieces_of(rows.parts(last_use=True), piece_positions)
    yield b"]," + orjson.dumps(members(rows.result()))[1:]
