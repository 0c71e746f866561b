"""A multiple-choice task of lm-evaluation-harness's own format, written to a folder (its
questions as JSONL beside its YAML) for `TaskManager(include_path=folder)`: the benchmark
(bench/lm_eval_client.py) and the tests (tests/e2e/test_lm_eval.py) run the harness on one."""

import json
from pathlib import Path

TASK_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {questions}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""


def write_task(folder: Path, name: str, docs: list[dict]) -> None:
    """docs: each a question, `{"context", "choices", "answer"}` (the right choice's index);
    the harness asks for each choice after `context` and a line `Answer:`."""
    questions = folder / "questions.jsonl"
    questions.write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    (folder / f"{name}.yaml").write_text(TASK_YAML.format(name=name, questions=questions))
