"""LoRA adapters served as models of their own on their base model's replicas (the session's
three tiny families each serve the store's rank-8 and rank-16 adapters): listed with their
parent, and every scoring path under an adapter equal to a float32 transformers forward pass
with the adapter merged by hand: echo with top-k, generated tokens, prompt top-k, labels, the
full vocabulary as JSON and `.npy`, a span after a priming request (read from the prefix cache),
a scored conversation, a batch line and dataset scoring. The base, an adapter and the base
again on one prompt each get their own numbers: no cache is shared between them."""

import math
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import httpx
import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest

from serve_app.batch.dataset import ScoreOptions
from serve_app.batch.scoring import score_dataset
from serve_app.store.adapter_store import adapter_path
from serve_app.store.model_store import embedded_model_path
from tests.e2e.conftest import ADAPTERS, FAMILIES, MISSING_ADAPTER, MISSING_ADAPTER_PATH, MODEL
from tests.e2e.reference import TOLERANCE, Reference, assert_rank, assert_top_texts, text_inside
from tests.e2e.test_batch import request_line, results, run_batch
from tests.e2e.test_conversation_scoring import CONVERSATION, span_of
from tests.e2e.test_full_vocab import npy_records
from tests.e2e.test_parallel import full_vocab_rows
from tests.e2e.test_prefix_reuse import cache_reads, context_and_choices, read_since, whole_blocks

ADAPTED = {adapter: family for family in FAMILIES for adapter in ADAPTERS[family]}
TEXT = "A short note on the tides, and why they turn twice a day."
TOP = 5
LABELS = [5, 17, 300]
# An adapter worth testing moves the base's numbers by far more than float noise.
MOVED = 0.05


@pytest.fixture(scope="module")
def merged():
    """Each adapter's float32 reference: its base with the adapter merged into the weights."""
    return {adapter: Reference(embedded_model_path(family), adapter_path(adapter))
            for adapter, family in ADAPTED.items()}


def post(http, path: str, **body) -> dict:
    response = http.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_each_adapter_is_listed_with_its_base_as_parent_and_never_its_folder(http):
    response = http.get("/v1/models")
    cards = {card["id"]: card for card in response.json()["data"]}
    for adapter, family in ADAPTED.items():
        assert cards[adapter]["parent"] == family and "root" not in cards[adapter]
        assert cards[adapter]["capabilities"] == cards[family]["capabilities"]
    assert str(adapter_path(next(iter(ADAPTED)))) not in response.text
    assert str(adapter_path("x").parent) not in response.text


def prompt_rows_moved(reference, merged_reference, ids: list[int]) -> float:
    return float(np.nanmax(np.abs(merged_reference.prompt_rows(ids) - reference.prompt_rows(ids))))


@pytest.mark.parametrize("adapter", ADAPTED)
def test_echo_and_generated_top_k_are_the_merged_model_s(http, references, merged, adapter):
    reference = merged[adapter]
    answer = post(http, "/v1/completions", model=adapter, prompt=TEXT, max_tokens=3, temperature=0,
                  echo=True, logprobs=TOP)
    assert answer["model"] == adapter
    logprobs = answer["choices"][0]["logprobs"]
    ids = reference.tokenizer(TEXT)["input_ids"]
    generated = reference.greedy(ids, 3)
    assert logprobs["token_ids"] == ids + generated
    rows = reference.prompt_rows(ids + generated)
    assert logprobs["token_logprobs"][0] is None
    for position in range(1, len(ids) + len(generated)):
        token = logprobs["token_ids"][position]
        assert logprobs["token_logprobs"][position] == pytest.approx(rows[position][token], abs=TOLERANCE)
        assert_top_texts(logprobs["top_logprobs"][position], reference.tokenizer, rows[position], TOP, token,
                         partial(text_inside, reference.tokenizer))
    assert prompt_rows_moved(references[ADAPTED[adapter]], reference, ids) > MOVED


@pytest.mark.parametrize("adapter", ADAPTED)
def test_prompt_top_k_and_labels_are_the_merged_model_s(http, merged, adapter):
    reference = merged[adapter]
    ids = reference.tokenizer(TEXT)["input_ids"]
    rows = reference.prompt_rows(ids)
    top = post(http, "/v1/completions", model=adapter, prompt=ids, max_tokens=1, prompt_logprobs=TOP)
    positions = top["choices"][0]["prompt_logprobs"]
    assert len(positions) == len(ids) and positions[0] is None
    for position, entries in enumerate(positions[1:], 1):
        assert len(entries) in (TOP, TOP + 1)  # the prompt's own token beside the top k
        for token, entry in entries.items():
            assert entry["logprob"] == pytest.approx(rows[position][int(token)], abs=TOLERANCE)
            assert_rank(rows[position], int(token), entry["rank"])
    labelled = post(http, "/v1/completions", model=adapter, prompt=ids, max_tokens=2, temperature=0,
                    echo=True, logprobs=0, logprob_token_ids=LABELS)["choices"][0]["logprobs"]
    every = reference.prompt_rows(labelled["token_ids"])
    for position, top_logprobs in enumerate(labelled["top_logprobs"][1:], 1):
        for label in LABELS:
            text = reference.tokenizer.decode([label])
            assert top_logprobs[text] == pytest.approx(every[position][label], abs=TOLERANCE)


@pytest.mark.parametrize("adapter", ADAPTED)
def test_the_full_vocabulary_as_json_and_npy_is_the_merged_model_s(http, merged, adapter):
    reference = merged[adapter]
    ids = reference.tokenizer(TEXT)["input_ids"]
    expected = reference.prompt_rows(ids)[1:]
    rows = full_vocab_rows(http, adapter, TEXT)
    assert rows.shape == expected.shape and not np.isnan(rows).any()
    np.testing.assert_allclose(rows, expected, atol=TOLERANCE)
    _, records = npy_records(http, {"model": adapter, "prompt": TEXT, "max_tokens": 1, "prompt_logprobs": -1})
    assert records["token_id"].tolist() == ids
    np.testing.assert_allclose(records["logprobs"][1:], expected, atol=TOLERANCE)


@pytest.mark.parametrize("adapter", ADAPTED)
def test_a_span_after_its_context_reads_the_prefix_cache_and_scores_as_the_merged_model(
        complete, merged, adapter):
    family, reference = ADAPTED[adapter], merged[adapter]
    context, choices = context_and_choices(reference, family, seed=f"adapters/{adapter}")
    start = len(context)
    before = cache_reads(family)
    for choice in choices:
        ids = context + choice
        logprobs = complete(model=adapter, prompt=ids, max_tokens=1, temperature=0, logprobs=TOP,
                            logprob_start_len=start)["choices"][0]["logprobs"]
        rows = reference.prompt_rows(ids)
        assert logprobs["token_ids"][:len(choice)] == choice
        values = logprobs["token_logprobs"][:len(choice)]
        for position, (token, value) in enumerate(zip(choice, values, strict=True), start):
            assert value == pytest.approx(rows[position][token], abs=TOLERANCE)
    hit = whole_blocks(family, start - 1)
    assert read_since(family, before, (len(choices) - 1) * hit) == (len(choices) - 1) * hit


CHAT_ADAPTERS = [adapter for adapter, family in ADAPTED.items() if family != "tiny-sentencepiece"]


@pytest.mark.parametrize("adapter", CHAT_ADAPTERS)
def test_a_scored_conversation_is_the_merged_model_s(http, merged, adapter):
    reference = merged[adapter]
    answer = post(http, "/v1/chat/completions", model=adapter, messages=CONVERSATION, max_tokens=1,
                  score_final_message=True, top_logprobs=3)
    assert answer["model"] == adapter
    ids = post(http, "/tokenize", model=adapter, messages=CONVERSATION)["tokens"]
    tokens = answer["final_message_logprobs"]["content"]
    start = span_of(ids, [token["token_id"] for token in tokens])
    rows = reference.prompt_rows(ids)
    for position, token in enumerate(tokens, start):
        assert token["logprob"] == pytest.approx(rows[position][token["token_id"]], abs=TOLERANCE)
        assert_rank(rows[position], token["token_id"], token["rank"])
    assert answer["final_message_logprobs"]["logprob_sum"] == pytest.approx(
        math.fsum(token["logprob"] for token in tokens), abs=1e-9)


@pytest.fixture(scope="module")
def client(base_url):
    import openai

    with openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0) as client:
        yield client


def test_a_batch_line_names_an_adapter_and_gets_the_online_answer(client, http):
    body = {"prompt": TEXT, "max_tokens": 2, "temperature": 0, "echo": True, "logprobs": 3}
    lines = [request_line(model, {**body, "model": model}) for model in (MODEL, *ADAPTERS[MODEL])]
    batch = run_batch(client, lines)
    assert batch.status == "completed" and batch.request_counts.completed == len(lines), batch
    output = results(client, batch.output_file_id)
    for model in (MODEL, *ADAPTERS[MODEL]):
        line = output[model]["response"]
        assert line["status_code"] == 200 and line["body"]["model"] == model
        online = post(http, "/v1/completions", model=model, **body)["choices"][0]["logprobs"]
        np.testing.assert_allclose(line["body"]["choices"][0]["logprobs"]["token_logprobs"][1:],
                                   online["token_logprobs"][1:], atol=TOLERANCE)


def test_dataset_scoring_with_an_adapter_scores_as_the_merged_model(base_url, merged, tmp_path):
    adapter = ADAPTERS[MODEL][0]
    reference = merged[adapter]
    source = tmp_path / "documents.jsonl"
    source.write_bytes(orjson.dumps({"text": TEXT}) + b"\n")
    run = score_dataset(str(source), str(tmp_path / "out"), ScoreOptions(model=adapter, top_k=2),
                        progress=False)
    assert (run.documents, run.refused) == (1, 0)
    (row,) = pq.read_table(tmp_path / "out").to_pylist()
    ids = reference.tokenizer(TEXT)["input_ids"]
    assert row["token_ids"] == ids
    expected = reference.prompt_rows(ids)[np.arange(1, len(ids)), ids[1:]]
    np.testing.assert_allclose(row["token_logprobs"][1:], expected, atol=TOLERANCE)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_base_an_adapter_and_the_base_again_each_get_their_own_numbers(complete, references, merged,
                                                                           family):
    """One prompt scored (echo with top-k, which the scored-prefix cache serves) on the base,
    then on an adapter, then on the base again: the adapter's are never the base's cached rows,
    nor the base's the adapter's."""
    adapter = ADAPTERS[family][1]
    ids = context_and_choices(references[family], family, seed=f"adapters/crossing/{family}")[0]
    for model, reference in ((family, references[family]), (adapter, merged[adapter]),
                             (family, references[family])):
        logprobs = complete(model=model, prompt=ids, max_tokens=1, temperature=0, echo=True,
                            logprobs=2)["choices"][0]["logprobs"]
        rows = reference.prompt_rows(ids)
        np.testing.assert_allclose(logprobs["token_logprobs"][1:len(ids)],
                                   rows[np.arange(1, len(ids)), ids[1:]], atol=TOLERANCE)


def test_an_adapter_its_replica_cannot_load_is_refused_and_the_replica_goes_on(http, merged):
    """The configured adapter whose folder is on no node: 400 `adapter_not_found` without the
    folder's path, each time; the model's other adapters and the base answer as before."""
    for _ in range(2):  # refused again: nothing half-loaded stays behind
        body = {"model": MISSING_ADAPTER, "prompt": TEXT, "max_tokens": 1}
        response = http.post("/v1/completions", json=body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["code"], error["param"]) == ("adapter_not_found", "model")
        assert MISSING_ADAPTER_PATH not in response.text
    adapter = ADAPTERS[MODEL][0]
    answer = post(http, "/v1/completions", model=adapter, prompt=TEXT, max_tokens=1, echo=True, logprobs=1)
    ids = merged[adapter].tokenizer(TEXT)["input_ids"]
    rows = merged[adapter].prompt_rows(ids)
    np.testing.assert_allclose(answer["choices"][0]["logprobs"]["token_logprobs"][1:len(ids)],
                               rows[np.arange(1, len(ids)), ids[1:]], atol=TOLERANCE)
    assert http.get("/health", params={"model": MODEL}).status_code == 200


@pytest.mark.parametrize("family", FAMILIES)
def test_the_base_and_its_adapters_scored_at_once_each_get_their_own_rows(base_url, references, merged,
                                                                          family):
    """Echoed prompts on the base and on each adapter sent together, three each, so that engine
    steps hold prompt rows of several adapters and of none at once (vLLM's LoRA on lm_head
    stopped the engine here, and its CPU ops computed the base's tokens with an adapter)."""
    models = {family: references[family], **{adapter: merged[adapter] for adapter in ADAPTERS[family]}}
    sent = [(model, f"{TEXT} ({index}.{copy})") for index, model in enumerate(models) for copy in range(3)]

    def echo(model_and_prompt: tuple[str, str]) -> dict:
        """The answer, sent again while the model's small queue (tiny-llama3's) refuses it."""
        model, prompt = model_and_prompt
        body = {"model": model, "prompt": prompt, "max_tokens": 1, "echo": True, "logprobs": 6}
        url = f"{base_url}/v1/completions"
        while (response := httpx.post(url, json=body, timeout=120)).status_code == 503:
            assert response.json()["error"]["code"] == "overloaded", response.text
            time.sleep(0.1)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["logprobs"]

    with ThreadPoolExecutor(len(sent)) as pool:
        answers = list(pool.map(echo, sent))
    for (model, prompt), logprobs in zip(sent, answers, strict=True):
        ids = models[model].tokenizer(prompt)["input_ids"]
        rows = models[model].prompt_rows(ids)
        np.testing.assert_allclose(logprobs["token_logprobs"][1:len(ids)],
                                   rows[np.arange(1, len(ids)), ids[1:]], atol=TOLERANCE, err_msg=model)
