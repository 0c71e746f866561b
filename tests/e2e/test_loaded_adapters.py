"""LoRA adapters loaded and unloaded at run time (vLLM's POST /v1/load_lora_adapter and
/v1/unload_lora_adapter) on the session's service, whose requests carry no key: listed with
their parent and never their folder, scored as a float32 forward pass with the adapter merged,
loaded again in place with caches of their own, refused with a code for every bad folder and
name, and not unloaded while a request on one is in flight. The tenants' side (each adapter its
tenant's alone, across two ingress replicas sharing Redis) is tests/e2e/test_tenancy.py's."""

import json
import re
import shutil
import threading
import uuid

import httpx
import pytest

from serve_app.store.adapter_store import StoreAdapter, adapter_name, adapter_path, build_adapter
from serve_app.store.home import adapters_dir
from serve_app.store.model_store import embedded_model_path
from tests.e2e.conftest import ADAPTERS, MODEL, TINY_SIBLING
from tests.e2e.reference import TOLERANCE, Reference
from tests.e2e.waiting import read_until

TEXT = "Tides turn twice a day, and the moon decides when."
R8, R16 = (adapter_path(adapter_name(MODEL, rank)) for rank in (8, 16))
METRICS_WAIT_S = 60  # Ray's metrics agent reports every 2 s
LEASE_END_S = 10


@pytest.fixture(scope="module")
def merged():
    return {folder: Reference(embedded_model_path(MODEL), folder) for folder in (R8, R16)}


def load(http, name: str, folder, **more):
    return http.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(folder),
                                                    "base_model": MODEL, **more})


def unload(http, name: str):
    return http.post("/v1/unload_lora_adapter", json={"lora_name": name})


def refusal(response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    return error["message"]


def echo_logprobs(http, model: str) -> tuple[list[int], list[float]]:
    response = http.post("/v1/completions", json={"model": model, "prompt": TEXT, "max_tokens": 1,
                                                  "temperature": 0, "echo": True, "logprobs": 0})
    assert response.status_code == 200, response.text
    logprobs = response.json()["choices"][0]["logprobs"]
    return logprobs["token_ids"], logprobs["token_logprobs"]


def assert_merged(http, model: str, reference: Reference) -> None:
    ids, logprobs = echo_logprobs(http, model)
    rows = reference.prompt_rows(ids)
    assert len(logprobs) == len(ids) and logprobs[0] is None
    for position, (token, logprob) in enumerate(zip(ids[1:], logprobs[1:], strict=True), 1):
        assert logprob == pytest.approx(rows[position][token], abs=TOLERANCE), position


def listed(http) -> dict[str, dict]:
    return {card["id"]: card for card in http.get("/v1/models").json()["data"]}


@pytest.fixture
def name(http):
    """A fresh adapter name, unloaded after the test whatever it left."""
    chosen = f"{MODEL}-loaded-{uuid.uuid4().hex[:8]}"
    yield chosen
    unload(http, chosen)


def engine_counter(metrics_url: str, metric: str, adapter: str) -> float:
    """A model replica's counter for one adapter, as Ray's metrics agent exports it."""
    text = httpx.get(metrics_url, timeout=30).text
    return sum(float(value) for labels, value in re.findall(rf"^ray_{metric}{{([^}}]*)}} (\S+)$", text, re.M)
               if f'adapter="{adapter}"' in labels and f'model="{MODEL}"' in labels)


def test_a_loaded_adapter_is_listed_scored_as_merged_and_gone_once_unloaded(http, merged, metrics_url, name):
    response = load(http, name, R8)
    assert response.status_code == 200, response.text
    card = response.json()
    assert (card["id"], card["parent"], card["object"]) == (name, MODEL, "model")
    assert str(R8) not in response.text and "root" not in card
    models = http.get("/v1/models")
    assert listed(http)[name]["parent"] == MODEL and str(R8) not in models.text
    assert_merged(http, name, merged[R8])
    # The replica counts the adapter's tokens under its name: the prompt's, all computed.
    prompt = len(merged[R8].tokenizer(TEXT)["input_ids"])
    for metric in ("probserve_prompt_tokens_total", "probserve_prefill_tokens_total"):
        counted = read_until(lambda metric=metric: engine_counter(metrics_url, metric, name),
                             lambda value: value >= prompt, METRICS_WAIT_S, f"{metric} of {name}")
        assert counted == prompt, metric
    response = unload(http, name)
    assert response.status_code == 200 and response.json() == {"id": name, "object": "model", "deleted": True}
    assert name not in listed(http)
    refusal(http.post("/v1/completions", json={"model": name, "prompt": TEXT, "max_tokens": 1}),
            404, "model_not_found")
    refusal(unload(http, name), 404, "model_not_found")


def test_an_adapter_loaded_again_in_place_scores_as_its_new_folder(http, merged, name):
    """The same name on another folder: its caches and engine slot are the new load's, so the
    scored-prefix cache filled under the first folder is never read."""
    assert load(http, name, R8).status_code == 200
    assert_merged(http, name, merged[R8])
    refusal(load(http, name, R16), 409, "adapter_name_taken")
    assert load(http, name, R16, load_inplace=True).status_code == 200
    assert_merged(http, name, merged[R16])


@pytest.fixture
def misfits():
    """Folders under the adapter root that are no adapter of tiny-llama: one for a model of
    another width, one of another PEFT method."""
    root = adapters_dir() / f"misfits-{uuid.uuid4().hex[:8]}"
    base, wider, prefix = root / "base", root / "wider", root / "prefix-tuning"
    for folder in (base, wider, prefix):
        folder.mkdir(parents=True)
    config = json.loads((embedded_model_path(MODEL) / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**config, "hidden_size": 2 * config["hidden_size"]}))
    build_adapter(wider, base, StoreAdapter(MODEL, 8), seed=5)
    shutil.copy(R8 / "adapter_model.safetensors", prefix)
    (prefix / "adapter_config.json").write_text(json.dumps({"peft_type": "PREFIX_TUNING", "r": 8}))
    yield {"wider": wider, "prefix": prefix, "absent": root / "absent", "root": root}
    shutil.rmtree(root)


def test_every_bad_load_is_refused_with_its_code_and_the_model_answers_after(http, merged, name, misfits):
    outside = refusal(load(http, name, "/etc"), 400, "adapter_path_not_allowed")
    assert str(adapters_dir()) in outside  # it says where adapters may be loaded from
    refusal(load(http, name, f"{adapters_dir()}/../models/{MODEL}"), 400, "adapter_path_not_allowed")
    refusal(load(http, name, misfits["wider"]), 400, "adapter_mismatch")
    refusal(load(http, name, misfits["prefix"]), 400, "adapter_not_found")
    refusal(load(http, name, misfits["absent"]), 400, "adapter_not_found")
    refusal(load(http, name, R8, base_model=TINY_SIBLING), 400, "lora_not_enabled")
    refusal(http.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(R8)}),
            400, "invalid_request")  # several models serve LoRA: base_model is needed
    refusal(load(http, "bad name", R8), 400, "invalid_request")
    for taken in (MODEL, ADAPTERS[MODEL][0]):
        refusal(load(http, taken, R8), 409, "adapter_name_taken")
    refusal(unload(http, ADAPTERS[MODEL][0]), 409, "adapter_configured")
    assert name not in listed(http)
    assert load(http, name, R8).status_code == 200  # nothing of the refusals stayed behind
    assert_merged(http, name, merged[R8])


def test_an_adapter_with_a_request_in_flight_is_not_unloaded(http, merged, name):
    assert load(http, name, R8).status_code == 200
    first_event, answered = threading.Event(), {}
    no_end = {str(token): -100 for token in merged[R8].tokenizer.all_special_ids}  # runs 200 tokens

    def stream() -> None:
        body = {"model": name, "prompt": TEXT, "max_tokens": 200, "logit_bias": no_end, "stream": True}
        with http.stream("POST", "/v1/completions", json=body) as response:
            for _ in response.iter_lines():
                first_event.set()
            answered["status"] = response.status_code
    reader = threading.Thread(target=stream)
    reader.start()
    assert first_event.wait(60)
    refusal(unload(http, name), 409, "adapter_in_use")
    reader.join(120)
    assert answered == {"status": 200}
    # The lease ends once the response is over, just after its last byte.
    unloaded = read_until(lambda: unload(http, name), lambda response: response.status_code != 409,
                          LEASE_END_S, "the adapter was not unloaded once its request was answered")
    assert unloaded.status_code == 200, unloaded.text
