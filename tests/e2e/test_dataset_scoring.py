"""Dataset scoring on Ray Data through the session's service: Parquet that pyarrow reads back
equal to the online API's answers and to the float32 reference; refused documents in their
rows with the online error codes; labels and the full vocabulary; chat messages; a rerun that
finds every part done, and one that writes only the part that was lost; the command line."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

from serve_app.batch.dataset import ScoreOptions
from serve_app.batch.scoring import score_dataset
from tests.e2e.conftest import MAX_MODEL_LEN, MODEL
from tests.e2e.reference import TOLERANCE, assert_top_k
from tests.e2e.test_online_first import BACKGROUND, requests_by_priority

pytestmark = pytest.mark.e2e

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Paris is the capital of France.",
         "1 2 3 4 5 6 7 8 9 10", "A", "Scoring " * 40]
TOP_K = 3
LABELS = (5, 17, 300)


def documents(reference) -> list[dict]:
    """Texts, token ids, a chat, and documents the API refuses (too long, no text)."""
    docs = [{"id": f"text-{i}", "text": text} for i, text in enumerate(TEXTS)]
    docs.append({"id": "ids", "text": reference.tokenizer("token ids as they are")["input_ids"]})
    docs.append({"id": "chat", "text": [{"role": "user", "content": "Hello there"},
                                        {"role": "assistant", "content": "Hi!"}]})
    docs.append({"id": "long", "text": "word " * MAX_MODEL_LEN})
    docs.append({"id": "no-text", "body": "elsewhere"})
    return docs


@pytest.fixture(scope="module")
def input_file(tmp_path_factory, reference):
    path = tmp_path_factory.mktemp("dataset") / "documents.jsonl"
    path.write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in documents(reference)) + b"{broken\n")
    return path


@pytest.fixture(scope="module")
def scored(base_url, input_file, tmp_path_factory):
    output = tmp_path_factory.mktemp("scored") / "out"
    options = ScoreOptions(model=MODEL, id_column="id", top_k=TOP_K)
    run = score_dataset(str(input_file), str(output), options, shard_rows=3, in_flight=4, progress=False)
    return run, output, options, input_file


def rows_by_id(output) -> dict[str, dict]:
    table = pq.read_table(output)
    assert sorted(table.column("row").to_pylist()) == list(range(len(table)))
    return {row["id"] or f"row-{row['row']}": row for row in table.to_pylist()}


def online_echo(http, prompt, **extra) -> dict:
    body = {"model": MODEL, "prompt": prompt, "echo": True, "max_tokens": 1, "temperature": 0, **extra}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["logprobs"]


def test_every_document_has_one_row_and_the_refused_say_why(scored, reference):
    run, output, _, _ = scored
    rows = rows_by_id(output)
    assert len(rows) == len(documents(reference)) + 1
    refused = {key: row["error_code"] for key, row in rows.items() if row["error_code"]}
    assert refused == {"long": "context_length_exceeded", "no-text": "missing_column",
                       "row-9": "invalid_json_line"}
    assert all(rows[key]["token_ids"] is None and rows[key]["sum_logprob"] is None for key in refused)
    assert (run.documents, run.refused, run.parts_written, run.parts_skipped) == (10, 3, 4, 0)
    assert run.scored_tokens == sum(row["scored_tokens"] or 0 for row in rows.values())


def test_the_numbers_are_the_online_apis_and_the_references(scored, http, reference):
    rows = rows_by_id(scored[1])
    for key, prompt in [*((f"text-{i}", text) for i, text in enumerate(TEXTS)), ("ids", None)]:
        row = rows[key]
        online = online_echo(http, prompt or row["token_ids"], logprobs=TOP_K)
        if prompt:
            assert row["token_ids"] == reference.tokenizer(prompt)["input_ids"]
        positions = len(row["token_ids"])
        assert row["token_logprobs"][0] is None and online["token_logprobs"][0] is None
        np.testing.assert_allclose(row["token_logprobs"][1:], online["token_logprobs"][1:positions],
                                   atol=TOLERANCE)
        expected = reference.prompt_rows(row["token_ids"])
        for position in range(1, positions):
            assert_top_k(expected[position], row["top_token_ids"][position], row["top_logprobs"][position],
                         TOP_K)
            assert row["token_ranks"][position] >= 1
        actual = expected[np.arange(1, positions), row["token_ids"][1:]]
        np.testing.assert_allclose(row["token_logprobs"][1:], actual, atol=TOLERANCE)
        assert row["scored_tokens"] == positions - 1
        assert row["sum_logprob"] == pytest.approx(float(actual.sum()), abs=TOLERANCE * positions)
        mean = row["sum_logprob"] / (positions - 1) if positions > 1 else None
        assert row["mean_logprob"] == pytest.approx(mean)


def test_chat_messages_are_scored_as_the_template_renders_them(scored, reference):
    row = rows_by_id(scored[1])["chat"]
    messages = documents(reference)[len(TEXTS) + 1]["text"]
    ids = list(reference.tokenizer.apply_chat_template(messages, add_generation_prompt=False,
                                                       tokenize=True)["input_ids"])
    assert row["token_ids"] == ids
    expected = reference.prompt_rows(ids)
    np.testing.assert_allclose(row["token_logprobs"][1:], expected[np.arange(1, len(ids)), ids[1:]],
                               atol=TOLERANCE)


def test_a_rerun_skips_the_parts_done_and_writes_the_one_lost(scored):
    run, output, options, input_file = scored
    before = pq.read_table(output).sort_by("row")
    again = score_dataset(str(input_file), str(output), options, shard_rows=3, progress=False)
    assert (again.documents, again.parts_written, again.parts_skipped) == (0, 0, run.parts_written)
    (output / "part-000001.parquet").unlink()
    (output / ".part-000002.parquet.writing").write_bytes(b"a crashed writer's leftovers")
    again = score_dataset(str(input_file), str(output), options, shard_rows=3, progress=False)
    assert (again.documents, again.parts_written, again.parts_skipped) == (3, 1, run.parts_written - 1)
    assert pq.read_table(output).sort_by("row").equals(before)


def test_a_rerun_with_other_settings_is_refused(scored):
    _, output, options, input_file = scored
    with pytest.raises(Exception, match="output_in_use|other settings"):
        score_dataset(str(input_file), str(output), ScoreOptions(model=MODEL, top_k=1), progress=False)


@pytest.fixture(scope="module")
def token_parquet(tmp_path_factory, reference):
    path = tmp_path_factory.mktemp("parquet") / "tokens.parquet"
    ids = [reference.tokenizer(text)["input_ids"] for text in TEXTS[:3]]
    pq.write_table(pa.table({"tokens": ids}), path, row_group_size=2)
    return path, ids


def test_labels_are_scored_after_each_document_as_online(base_url, http, token_parquet, tmp_path, reference):
    path, ids = token_parquet
    options = ScoreOptions(model=MODEL, column="tokens", labels=LABELS)
    before = requests_by_priority()
    score_dataset(str(path), str(tmp_path / "out"), options, shard_rows=2, progress=False)
    # Each document came to the engine at the batch's priority, behind online requests.
    assert requests_by_priority().get(BACKGROUND, 0) - before.get(BACKGROUND, 0) == len(ids)
    table = pq.read_table(tmp_path / "out").sort_by("row")
    for row, prompt in zip(table.to_pylist(), ids, strict=True):
        expected = reference.log_softmax(prompt)[-1][list(LABELS)]
        np.testing.assert_allclose(row["label_logprobs"], expected, atol=TOLERANCE)
        # The online answer after the text, keyed by each label's text.
        online = online_echo(http, prompt, logprob_token_ids=list(LABELS))["top_logprobs"][-1]
        np.testing.assert_allclose(row["label_logprobs"],
                                   [online[reference.tokenizer.decode([label])] for label in LABELS],
                                   atol=TOLERANCE)


def test_the_full_vocabulary_is_every_positions_distribution(base_url, token_parquet, tmp_path, reference):
    path, ids = token_parquet
    options = ScoreOptions(model=MODEL, column="tokens", full_vocab=True)
    score_dataset(str(path), str(tmp_path / "out"), options, shard_rows=2, in_flight=2, progress=False)
    table = pq.read_table(tmp_path / "out").sort_by("row")
    width = reference.model.config.vocab_size
    assert table.schema.field("vocab_logprobs").type == pa.list_(pa.list_(pa.float32(), width))
    for row, prompt in zip(table.to_pylist(), ids, strict=True):
        assert row["vocab_logprobs"][0] is None
        np.testing.assert_allclose(np.array(row["vocab_logprobs"][1:]), reference.prompt_rows(prompt)[1:],
                                   atol=TOLERANCE)


def test_the_command_line_scores_into_the_cluster_it_is_pointed_at(base_url, input_file, tmp_path):
    output = tmp_path / "out"
    address = ray.get_runtime_context().gcs_address
    command = [str(Path(sys.executable).with_name("probserve")), "score", str(input_file), "--model", MODEL,
               "--output", str(output), "--shard-rows", "5", "--address", address]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "refused 3" in done.stdout and "2 parts written" in done.stdout
    assert pq.read_table(output).num_rows == len(input_file.read_bytes().splitlines())
    again = subprocess.run([*command, "--top-k", "2"], capture_output=True, text=True, timeout=300)
    assert again.returncode != 0 and "(output_in_use)" in again.stderr
