"""Dataset scoring's plain parts (serve_app.batch.scoring runs them on Ray Data): the input cut
into shards of rows that a rerun finds again, each document as the completion request it
stands for, and the engine's answers as the Arrow columns of the output's parts.

A document is scored as `/v1/completions` scores it with `echo: true, max_tokens: 1,
temperature: 0, logprobs: K` (and `logprob_token_ids` for labels), through the same
admission, so its numbers are the online API's. A document the API would refuse gets its
error's code and message in its row, and the others are scored.
"""

import io
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from serve_app.api import admission
from serve_app.api.conversation import render_chat
from serve_app.api.request_models import MESSAGES_RULE, ChatRequest, CompletionRequest, parse_request
from serve_app.config import Capabilities, IngressConfig
from serve_app.engine.wire import Adapter, Caller, EngineRequest, EngineResult
from serve_app.errors import APIError, invalid
from serve_app.text.vocabulary import Vocabulary

FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
PART = re.compile(r"part-(\d{6})\.parquet")
ROW = "row"  # each output row's document: its row in the whole input, from 0


@dataclass(frozen=True)
class ScoreOptions:
    """What a run asks of every document."""

    model: str
    column: str = "text"  # a text, token ids, or chat messages
    id_column: str | None = None  # carried to the output beside ROW
    top_k: int = 0  # the top k of each position, beside the document's own token
    labels: tuple[int, ...] = ()  # these ids' logprobs at the position after the document
    full_vocab: bool = False  # every token's logprob at every position (prompt_logprobs -1)
    tenant: str = ""  # whose prefix caches the requests read and fill

    def check(self) -> None:
        if self.top_k < 0:
            raise invalid("top_k", f"top_k must be 0 or more, got {self.top_k}")
        if self.labels and (self.top_k or self.full_vocab):
            raise invalid("labels", "labels stand in for the top-k and the full vocabulary (as "
                          "logprob_token_ids does): ask for one of them", "invalid_combination")


@dataclass(frozen=True)
class Shard:
    """Rows of one input file, scored together into one part of the output."""

    index: int  # the part's number
    path: str  # the input file, on the input's filesystem
    first_row: int  # its first document's row in the whole input
    rows: int
    start: int  # JSONL: the byte its first line starts at; Parquet: its first row in the file


def absolute(uri: str) -> str:
    """A URL as it is, a local path made absolute: the scorers run in folders of their own."""
    return uri if "://" in uri else os.path.abspath(uri)


def part_name(index: int) -> str:
    return f"part-{index:06d}.parquet"


def finished_parts(fs: pafs.FileSystem, folder: str) -> set[int]:
    """The shards whose parts the output already holds (a part is renamed into place whole)."""
    if fs.get_file_info(folder).type == pafs.FileType.NotFound:
        return set()
    found = fs.get_file_info(pafs.FileSelector(folder))
    return {int(match.group(1)) for info in found if (match := PART.fullmatch(info.base_name))}


def input_files(fs: pafs.FileSystem, path: str) -> list[pafs.FileInfo]:
    """The file at `path`, or the JSONL and Parquet files under the folder, in name order."""
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise invalid("input", f"the input {path} does not exist")
    if info.type == pafs.FileType.File:
        file_format(info.path)
        return [info]
    found = [f for f in fs.get_file_info(pafs.FileSelector(path, recursive=True))
             if f.type == pafs.FileType.File and f.extension and "." + f.extension in FORMATS
             and not f.base_name.startswith(("_", "."))]
    if not found:
        raise invalid("input", f"the folder {path} holds no .jsonl, .json or .parquet file")
    return sorted(found, key=lambda f: f.path)


def file_format(path: str) -> str:
    suffix = path[path.rfind("."):].lower() if "." in path else ""
    if suffix not in FORMATS:
        raise invalid("input", f"{path}: expected a .jsonl (or .json, one object a line) or "
                      ".parquet file", "unsupported_input_format")
    return FORMATS[suffix]


def plan_shards(fs: pafs.FileSystem, files: list[pafs.FileInfo], shard_rows: int) -> list[Shard]:
    """The input's rows in shards of at most `shard_rows`, never across files: the same input
    gives the same shards, so a rerun knows its parts."""
    shards, first_row = [], 0
    for info in files:
        if file_format(info.path) == "parquet":
            with fs.open_input_file(info.path) as source:
                total = pq.ParquetFile(source).metadata.num_rows
            starts = [(start, min(shard_rows, total - start)) for start in range(0, total, shard_rows)]
        else:
            with fs.open_input_stream(info.path) as source:
                starts = list(jsonl_shard_starts(io.BufferedReader(source), shard_rows))
        for start, rows in starts:
            shards.append(Shard(len(shards), info.path, first_row, rows, start))
            first_row += rows
    return shards


def jsonl_shard_starts(source, shard_rows: int) -> Iterator[tuple[int, int]]:
    """(byte offset, documents) of each run of `shard_rows` non-blank lines, in one pass."""
    offset, start, rows = 0, 0, 0
    for line in iter(source.readline, b""):
        if line.strip():
            if rows == 0:
                start = offset
            rows += 1
            if rows == shard_rows:
                yield start, rows
                rows = 0
        offset += len(line)
    if rows:
        yield start, rows


def read_shard(fs: pafs.FileSystem, shard: Shard, columns: list[str]) -> list[dict]:
    """The shard's documents as {column: value} (a JSONL line that is not a JSON object
    comes back as {"": its error})."""
    if file_format(shard.path) == "parquet":
        return read_parquet_rows(fs, shard, columns)
    documents = []
    with fs.open_input_file(shard.path) as raw:
        raw.seek(shard.start)
        source = io.BufferedReader(raw)  # pyarrow's own files read no lines
        while len(documents) < shard.rows:
            line = source.readline()
            if line.strip():
                documents.append(json_document(line, shard.first_row + len(documents)))
    return documents


def json_document(line: bytes, row: int) -> dict:
    try:
        document = orjson.loads(line)
    except orjson.JSONDecodeError as error:
        return {"": invalid("input", f"row {row} is not JSON: {error}", "invalid_json_line")}
    if not isinstance(document, dict):
        return {"": invalid("input", f"row {row} is not a JSON object", "invalid_json_line")}
    return document


def read_parquet_rows(fs: pafs.FileSystem, shard: Shard, columns: list[str]) -> list[dict]:
    """The shard's rows, reading only the row groups that hold them."""
    with fs.open_input_file(shard.path) as source:
        parquet = pq.ParquetFile(source)
        present = [c for c in columns if c in parquet.schema_arrow.names]
        groups, first, group_start = [], None, 0
        for group in range(parquet.num_row_groups):
            group_rows = parquet.metadata.row_group(group).num_rows
            if group_start + group_rows > shard.start and group_start < shard.start + shard.rows:
                groups.append(group)
                first = group_start if first is None else first
            group_start += group_rows
        table = parquet.read_row_groups(groups, columns=present)
    return table.slice(shard.start - first, shard.rows).to_pylist()


def request_body(document: object, options: ScoreOptions, vocab: Vocabulary) -> dict:
    """The completion request a document stands for: a text or token ids as they are, chat
    messages rendered whole with the model's template (nothing generated after them)."""
    if isinstance(document, list) and document and isinstance(document[0], dict):
        chat = parse_request(ChatRequest, {"model": options.model, "messages": document,
                                           "add_generation_prompt": False}, {"messages": MESSAGES_RULE})
        document = render_chat(chat.messages, vocab, chat).token_ids
    body = {"model": options.model, "prompt": document, "echo": True, "max_tokens": 1,
            "temperature": 0.0, "logprobs": options.top_k}
    if options.full_vocab:
        body["prompt_logprobs"] = -1
    if options.labels:
        body["logprob_token_ids"] = list(options.labels)
    return body


def admit_document(document: dict, options: ScoreOptions, caps: Capabilities, ingress: IngressConfig,
                   vocab: Vocabulary, priority: int, adapter: Adapter | None = None) -> EngineRequest:
    """The document's engine request, of the run's tenant at `priority` (on `adapter`, if the
    run's model is one), after every check the online API makes; APIError if it would refuse it."""
    if "" in document:
        raise document[""]
    if options.column not in document or document[options.column] is None:
        raise invalid(options.column, f"the document has no {options.column!r} (--column)",
                      "missing_column")
    body = request_body(document[options.column], options, vocab)
    rules = admission.rules(caps, ingress)
    admitted = admission.admit_completion(parse_request(CompletionRequest, body, rules), caps, ingress,
                                          vocab, Caller(options.tenant, priority, adapter))
    return admitted.engine_requests[0]


@dataclass
class PartColumns:
    """A part's columns, document by document; None where a document was refused."""

    options: ScoreOptions
    id_type: pa.DataType  # the id column's, found over the whole shard: its groups agree
    vocab_width: int  # the model's logits: the full vocabulary's rows
    rows: list[int]
    ids: list
    scores: list[tuple | None]
    errors: list[APIError | None]

    @classmethod
    def empty(cls, options: ScoreOptions, id_type: pa.DataType = pa.null(),
              vocab_width: int = 0) -> "PartColumns":
        return cls(options, id_type, vocab_width, [], [], [], [])

    def add(self, row: int, document_id, scored: tuple | None, error: APIError | None = None) -> None:
        self.rows.append(row)
        self.ids.append(document_id)
        self.scores.append(scored)
        self.errors.append(error)

    def refused(self) -> int:
        return sum(error is not None for error in self.errors)

    def scored_tokens(self) -> int:
        return sum(len(s[0]) - 1 for s in self.scores if s is not None)

    def table(self) -> pa.Table:
        columns = {ROW: pa.array(self.rows, pa.int64())}
        if self.options.id_column:
            columns[self.options.id_column] = pa.array(self.ids, self.id_type)
        columns.update(score_columns(self.scores, self.options, self.vocab_width))
        columns["error_code"] = pa.array([e.code if e else None for e in self.errors], pa.string())
        columns["error_message"] = pa.array([e.message if e else None for e in self.errors], pa.string())
        return pa.table(columns)


def document_scores(result: EngineResult, options: ScoreOptions) -> tuple:
    """One document's arrays, a row a position: its token ids, each one's logprob and rank,
    the top k's ids and logprobs (position 0, which nothing predicts, NaN and zeros: written as
    nulls), the labels' logprobs at the position after the document, and the full vocabulary's
    rows (a zero row at position 0)."""
    token_ids = result.prompt_token_ids
    positions = result.prompt_positions(options.top_k)
    entries = positions.offsets[1:len(token_ids)]
    logprobs = np.concatenate([[np.nan], positions.logprobs[entries]]).astype(np.float32)
    ranks = np.concatenate([[0], positions.ranks[entries]]).astype(np.int32)
    top = entries[:, None] + 1 + np.arange(options.top_k)
    unpredicted = np.zeros((1, options.top_k))
    top_ids = np.vstack([unpredicted, positions.token_ids[top]]).astype(np.int32)
    top_logprobs = np.vstack([unpredicted, positions.logprobs[top]]).astype(np.float32)
    labels = np.empty(0, np.float32)
    if options.labels:
        labels = result.completions[0].logprobs.top(0, len(options.labels))[1]
    vocab_rows = []  # kept in the engine's chunks: the part's column copies them once
    if options.full_vocab:
        vocab_rows = [chunk.logprobs for chunk in result.full_vocab.chunks]
        vocab_rows.insert(0, np.zeros((1, vocab_rows[0].shape[1]), np.float32))
    return token_ids, logprobs, ranks, top_ids, top_logprobs, labels, vocab_rows


def score_columns(scores: list[tuple | None], options: ScoreOptions,
                  vocab_width: int = 0) -> dict[str, pa.Array]:
    """A part's score columns: lists over each document's positions (null for a refused
    document, null at position 0), and its sums."""
    present = [s for s in scores if s is not None]
    refused = pa.array([s is None for s in scores])
    lengths = [len(s[0]) if s else 0 for s in scores]
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32))

    def joined(index: int, dtype) -> np.ndarray:
        return np.concatenate([s[index] for s in present]).astype(dtype) if present else np.empty(0, dtype)

    def listed(values: pa.Array) -> pa.Array:
        return pa.ListArray.from_arrays(offsets, values, mask=refused)

    logprobs = joined(1, np.float32)
    unpredicted = np.isnan(logprobs)
    columns = {"token_ids": listed(pa.array(joined(0, np.int32))),
               "token_logprobs": listed(pa.array(logprobs, mask=unpredicted)),
               "token_ranks": listed(pa.array(joined(2, np.int32), mask=unpredicted))}
    if options.top_k:
        for name, index, dtype in (("top_token_ids", 3, np.int32), ("top_logprobs", 4, np.float32)):
            rows = joined(index, dtype).reshape(-1)
            columns[name] = listed(pa.FixedSizeListArray.from_arrays(
                pa.array(rows), options.top_k, mask=pa.array(unpredicted)))
    if options.full_vocab:
        columns["vocab_logprobs"] = listed(full_vocab_rows(present, unpredicted, vocab_width))
    if options.labels:
        columns["label_logprobs"] = pa.array([s[5].tolist() if s else None for s in scores],
                                             pa.list_(pa.float32()))
    sums = [float(np.nansum(s[1], dtype=np.float64)) if s else None for s in scores]
    counted = [len(s[0]) - 1 if s else None for s in scores]
    columns["scored_tokens"] = pa.array(counted, pa.int32())
    columns["sum_logprob"] = pa.array(sums, pa.float64())
    columns["mean_logprob"] = pa.array([total / n if n else None for total, n in zip(sums, counted)],
                                       pa.float64())
    return columns


def full_vocab_rows(present: list[tuple], unpredicted: np.ndarray, width: int) -> pa.Array:
    """Every position's distribution as a fixed-size float32 list (null at position 0), in
    token-id order: `vocab_logprobs[d][p][t]` is token t's logprob at position p."""
    values = np.concatenate([rows for s in present for rows in s[6]] or [np.empty((0, width), np.float32)])
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), width,
                                             mask=pa.array(unpredicted))
