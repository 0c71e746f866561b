"""Dataset scoring's plain parts: the input cut into the same shards on every run, documents
admitted as the online API admits them, and the engine's answers as Arrow columns."""

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from serve_app.batch import dataset
from serve_app.batch.dataset import PartColumns, ScoreOptions
from serve_app.batch.scoring import claim_output, run_settings
from serve_app.config import Capabilities, IngressConfig
from serve_app.engine.wire import Completion, EngineResult
from serve_app.errors import APIError, invalid
from tests.unit.fakes import char_vocabulary, full_vocab_parts, positions

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
VOCAB = char_vocabulary("abcdxyz<>user", chat_template=TEMPLATE)
CAPS = Capabilities(max_logprobs=5, max_model_len=16, max_logprob_token_ids=4, full_vocab_max_prompt_tokens=8)
INGRESS = IngressConfig()
LOCAL = pafs.LocalFileSystem()


def jsonl(path, *lines: bytes):
    path.write_bytes(b"".join(lines))
    return path


def line(**document) -> bytes:
    return orjson.dumps(document) + b"\n"


def planned(path, shard_rows: int) -> list[dataset.Shard]:
    return dataset.plan_shards(LOCAL, dataset.input_files(LOCAL, str(path)), shard_rows)


def read_all(shards: list[dataset.Shard], columns=("text",)) -> list[dict]:
    return [document for shard in shards for document in dataset.read_shard(LOCAL, shard, list(columns))]


def test_jsonl_shards_skip_blank_lines_and_read_back_in_order(tmp_path):
    path = jsonl(tmp_path / "in.jsonl", line(text="a"), b"\n", line(text="b"), line(text="c"),
                 b"  \n", line(text="d"), line(text="e"))
    shards = planned(path, 2)
    assert [(s.index, s.first_row, s.rows) for s in shards] == [(0, 0, 2), (1, 2, 2), (2, 4, 1)]
    assert [d["text"] for d in read_all(shards)] == ["a", "b", "c", "d", "e"]
    assert planned(path, 2) == shards


def test_a_jsonl_line_that_is_no_object_becomes_that_documents_error(tmp_path):
    path = jsonl(tmp_path / "in.jsonl", line(text="a"), b"{broken\n", b"[1, 2]\n")
    errors = [d.get("") for d in read_all(planned(path, 8))]
    assert errors[0] is None
    assert [(e.code, "row 1" in e.message) for e in errors[1:2]] == [("invalid_json_line", True)]
    assert errors[2].code == "invalid_json_line"


def test_parquet_shards_span_row_groups(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": [f"t{i}" for i in range(7)], "id": list(range(7))}), path,
                   row_group_size=3)
    shards = planned(path, 2)
    assert [(s.first_row, s.start, s.rows) for s in shards] == [(0, 0, 2), (2, 2, 2), (4, 4, 2), (6, 6, 1)]
    assert read_all(shards, ("text", "id", "absent")) == [{"text": f"t{i}", "id": i} for i in range(7)]


def test_a_folder_is_read_file_by_file_in_name_order_without_hidden_files(tmp_path):
    jsonl(tmp_path / "b.jsonl", line(text="b0"))
    pq.write_table(pa.table({"text": ["a0", "a1", "a2"]}), tmp_path / "a.parquet")
    jsonl(tmp_path / "_notes.jsonl", line(text="hidden"))
    (tmp_path / "README.md").write_text("not data")
    shards = planned(tmp_path, 2)
    assert [(s.path.rsplit("/", 1)[1], s.first_row, s.rows) for s in shards] == [
        ("a.parquet", 0, 2), ("a.parquet", 2, 1), ("b.jsonl", 3, 1)]
    assert [d["text"] for d in read_all(shards)] == ["a0", "a1", "a2", "b0"]


@pytest.mark.parametrize(("name", "code"), [("in.csv", "unsupported_input_format"),
                                            ("missing.jsonl", "invalid_request"),
                                            ("empty", "invalid_request")])
def test_an_input_that_cannot_be_read_is_refused(tmp_path, name, code):
    (tmp_path / "in.csv").write_text("text\na\n")
    (tmp_path / "empty").mkdir()
    with pytest.raises(APIError) as caught:
        dataset.input_files(LOCAL, str(tmp_path / name))
    assert (caught.value.param, caught.value.code) == ("input", code)


def test_finished_parts_are_the_whole_ones(tmp_path):
    for name in ("part-000000.parquet", "part-000003.parquet", ".part-000001.parquet.writing", "x.parquet"):
        (tmp_path / name).write_bytes(b"")
    assert dataset.finished_parts(LOCAL, str(tmp_path)) == {0, 3}
    assert dataset.finished_parts(LOCAL, str(tmp_path / "none")) == set()

BACKGROUND = 2


def admitted(document: dict, **asked):
    return dataset.admit_document(document, ScoreOptions(model="m", **asked), CAPS, INGRESS, VOCAB,
                                  BACKGROUND)


def test_a_document_is_the_echo_request_of_the_online_api():
    request = admitted({"text": "abcd"}, top_k=2)
    assert request.prompt_token_ids == [0, 1, 2, 3]
    assert (request.max_tokens, request.temperature, request.prompt_logprobs) == (1, 0.0, 2)
    assert admitted({"text": [3, 2, 1]}).prompt_token_ids == [3, 2, 1]
    assert admitted({"text": "ab"}, labels=(0, 3)).logprob_token_ids == [0, 3]
    assert admitted({"text": "ab"}, full_vocab=True).prompt_logprobs == -1


def test_a_document_is_the_run_s_tenant_s_at_the_background_priority():
    request = admitted({"text": "ab"}, tenant="acme")
    assert (request.tenant, request.priority) == ("acme", BACKGROUND)


def test_chat_messages_are_rendered_whole_with_no_reply_begun():
    messages = [{"role": "user", "content": "ab"}]
    assert VOCAB.decode(admitted({"text": messages}).prompt_token_ids) == "<user>ab"


@pytest.mark.parametrize(("document", "asked", "code"), [
    ({"other": "a"}, {}, "missing_column"),
    ({"text": None}, {}, "missing_column"),
    ({"text": "a" * 16}, {}, "context_length_exceeded"),
    ({"text": "a" * 9}, {"full_vocab": True}, "full_vocab_prompt_too_long"),
    ({"text": [1, 99]}, {}, "invalid_token_id"),
    ({"text": "ab"}, {"top_k": 6}, "invalid_request"),
    ({"text": [{"role": "bot", "content": "ab"}]}, {}, "invalid_request"),
    ({"": invalid("input", "row 3 is not JSON", "invalid_json_line")}, {}, "invalid_json_line"),
])
def test_a_document_the_api_would_refuse_is_refused_with_its_code(document, asked, code):
    with pytest.raises(APIError) as caught:
        admitted(document, **asked)
    assert caught.value.code == code


@pytest.mark.parametrize("asked", [{"top_k": -1}, {"top_k": 2, "labels": (1,)},
                                   {"full_vocab": True, "labels": (1,)}])
def test_options_that_contradict_themselves_are_refused(asked):
    with pytest.raises(APIError):
        ScoreOptions(model="m", **asked).check()


def top_k_result(token_ids: list[int], rows: list, labels=None) -> EngineResult:
    completion = Completion(0, np.array([0]), "a", "length", positions(labels) if labels else None)
    return EngineResult(np.array(token_ids), positions(None, *rows), [completion])


def test_columns_hold_each_documents_positions_with_nulls_where_nothing_was_scored():
    options = ScoreOptions(model="m", id_column="id", top_k=2)
    columns = PartColumns.empty(options, pa.string())
    scored = top_k_result([0, 1, 2], [[(1, -0.5, 1), (1, -0.5, 1), (2, -1.5, 2)],
                                      [(2, -2.0, 3), (0, -0.25, 1), (1, -1.0, 2)]])
    columns.add(7, "a", dataset.document_scores(scored, options))
    columns.add(8, "b", None, invalid("prompt", "too long", "context_length_exceeded"))
    rows = columns.table().to_pylist()
    assert rows[0] == {"row": 7, "id": "a", "token_ids": [0, 1, 2], "token_logprobs": [None, -0.5, -2.0],
                       "token_ranks": [None, 1, 3], "top_token_ids": [None, [1, 2], [0, 1]],
                       "top_logprobs": [None, [-0.5, -1.5], [-0.25, -1.0]], "scored_tokens": 2,
                       "sum_logprob": -2.5, "mean_logprob": -1.25, "error_code": None, "error_message": None}
    unscored = dict.fromkeys(["token_ids", "token_logprobs", "token_ranks", "top_token_ids", "top_logprobs",
                              "scored_tokens", "sum_logprob", "mean_logprob"])
    assert rows[1] == {"row": 8, "id": "b", **unscored, "error_code": "context_length_exceeded",
                       "error_message": "too long"}


def test_labels_are_scored_at_the_position_after_the_document():
    options = ScoreOptions(model="m", labels=(3, 1))
    result = top_k_result([0, 1], [[(1, -0.5, 1)]], labels=[(0, -0.1, 1), (3, -2.0, 4), (1, -3.0, 5)])
    columns = PartColumns.empty(options)
    columns.add(0, None, dataset.document_scores(result, options))
    (row,) = columns.table().to_pylist()
    assert row["label_logprobs"] == [-2.0, -3.0]
    assert "top_token_ids" not in row


def test_the_full_vocabulary_is_a_fixed_size_float32_row_a_position():
    options = ScoreOptions(model="m", full_vocab=True, top_k=1)
    distributions = np.log(np.array([[0.5, 0.25, 0.25], [0.125, 0.125, 0.75]]))
    result = EngineResult(np.array([0, 1, 2]), None, [], full_vocab_parts(distributions, [0, 1, 2], 1, 1))
    columns = PartColumns.empty(options, vocab_width=3)
    columns.add(0, None, dataset.document_scores(result, options))
    columns.add(1, None, None, invalid("prompt", "too long", "full_vocab_prompt_too_long"))
    table = columns.table()
    assert table.schema.field("vocab_logprobs").type == pa.list_(pa.list_(pa.float32(), 3))
    rows = table.column("vocab_logprobs").to_pylist()
    assert rows[0][0] is None and rows[1] is None
    np.testing.assert_allclose(rows[0][1:], distributions, rtol=1e-6)
    assert table.column("top_token_ids").to_pylist()[0] == [None, [0], [2]]
    np.testing.assert_allclose(table.column("token_logprobs").to_pylist()[0][1:], np.log([0.25, 0.75]),
                               rtol=1e-6)


def test_an_output_folder_is_claimed_by_one_run(tmp_path):
    path = tmp_path / "in.jsonl"
    jsonl(path, line(text="a"))
    files = dataset.input_files(LOCAL, str(path))
    settings = run_settings(ScoreOptions(model="m"), files, 64)
    claim_output(LOCAL, str(tmp_path / "out"), settings)
    claim_output(LOCAL, str(tmp_path / "out"), settings)
    for folder, other in [("out", run_settings(ScoreOptions(model="m", top_k=1), files, 64)),
                          ("", settings)]:
        with pytest.raises(APIError) as caught:
            claim_output(LOCAL, str(tmp_path / folder), other)
        assert caught.value.code == "output_in_use"
