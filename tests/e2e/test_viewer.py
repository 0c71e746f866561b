"""The token-probability viewer at /ui in a real browser (Debian's headless Chromium, driven by
Selenium) on the session's service: what it shows is what the API answers (offsets, pieces,
log-probabilities, ranks, alternatives) and what the float32 reference computes, on every
tokenizer family; hover and keyboard focus, a selected span, labels, two models compared,
chat, a long text, the exports and the errors (/ui switched off: tests/e2e/test_stop.py's
services). The screenshots of
docs/images are taken here (`make screenshots` writes them there, a test run into a folder of
its own). The key a tenancy service asks for: tests/e2e/test_tenancy.py."""

import csv
import json
import math

import numpy as np
import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select
from transformers import AutoTokenizer

from serve_app.store.model_store import SMOLLM2, TINY_SIBLING, embedded_model_path
from tests.e2e.browser import Browser
from tests.e2e.conftest import ADAPTERS, FAMILIES, MAX_MODEL_LEN, MODEL, TINY_BOS
from tests.e2e.reference import TOLERANCE

pytestmark = pytest.mark.e2e

README_TEXT = "The capital of France is Paris."
# Several scripts, accents, an emoji and a line break: the offsets count code points.
MIXED_TEXT = "Größe of the café 👍 is naïve,\nsaid 東京 twice."
K = 5
REFUSED_FETCH = "Failed to load resource: the server responded with a status of 4"
# SmolLM2's context is 2,048 tokens: a text of 2,047 and the one token generated after it.
LONG_TEXT_TOKENS = 2047
# The page's scale: log-probability 0 is its brightest colour, -12 and below its darkest.
SHOWN_TOKENS = """
const view = document.querySelectorAll("#views .view")[arguments[0]];
return [...view.querySelectorAll(".token")].map((span) => ({
  index: Number(span.dataset.index), offset: Number(span.dataset.offset), piece: span.textContent,
  logprob: span.dataset.logprob === undefined ? null : Number(span.dataset.logprob),
  special: span.classList.contains("special"), unscored: span.classList.contains("unscored"),
  colour: getComputedStyle(span).backgroundColor}));
"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    browser = Browser(tmp_path_factory.mktemp("downloads"))
    yield browser
    browser.quit()


@pytest.fixture
def page(browser, base_url):
    """The viewer loaded afresh, its models listed; no error in the browser's console after
    but the refusals a test asks for (a script or style the Content-Security-Policy blocked,
    or an uncaught exception, would be one)."""
    browser.open(f"{base_url}/ui")
    browser.wait_for(lambda _: browser.find("#model").get_attribute("value"))
    browser.console_errors()  # from here on
    yield browser
    assert [e for e in browser.console_errors() if REFUSED_FETCH not in e] == []


def scoring_body(model: str, prompt, k: int = K) -> dict:
    """What the page sends for a whole text."""
    return {"model": model, "prompt": prompt, "echo": True, "max_tokens": 1, "temperature": 0,
            "logprobs": k, "prompt_logprobs": k}


def answer_of(http, body: dict) -> dict:
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def fill(page, css: str, text: str) -> None:
    field = page.find(css)
    field.clear()
    field.send_keys(text)


def click_and_wait(page, button: str) -> None:
    """Clicks a button and waits for its request to end, done or failed."""
    page.find(button).click()
    page.wait_for(lambda _: page.find("#status").text.endswith("done") or page.find("#error").is_displayed())


def score(page, model: str, text: str, compare: str = "") -> None:
    Select(page.find("#model")).select_by_value(model)
    Select(page.find("#compare-model")).select_by_value(compare)
    fill(page, "#text", text)
    click_and_wait(page, "#score")
    assert not page.find("#error").is_displayed(), page.find("#error").text


def shown(page, view: int = 0) -> list[dict]:
    return page.script(SHOWN_TOKENS, view)


def luminance(colour: str) -> float:
    r, g, b = (float(c) for c in colour[colour.index("(") + 1:colour.index(")")].split(",")[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def assert_shown_as_answered(tokens: list[dict], answer: dict) -> None:
    """The page's tokens are the answer's prompt tokens: offsets, pieces, log-probabilities."""
    logprobs, prompt_tokens = answer["choices"][0]["logprobs"], answer["usage"]["prompt_tokens"]
    assert [t["offset"] for t in tokens] == logprobs["text_offset"][:prompt_tokens]
    assert [t["piece"] for t in tokens] == logprobs["tokens"][:prompt_tokens]
    expected = logprobs["token_logprobs"][:prompt_tokens]
    assert [t["logprob"] is None for t in tokens] == [v is None for v in expected]
    np.testing.assert_allclose([t["logprob"] for t in tokens if t["logprob"] is not None],
                               [v for v in expected if v is not None], atol=TOLERANCE)


def test_the_page_comes_with_its_policy_and_lists_the_models(http, page):
    folder = http.get("/ui", follow_redirects=False)
    assert (folder.status_code, folder.headers["location"]) == (307, "ui/")
    served = http.get("/ui/")
    assert served.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in served.headers["content-security-policy"]
    models = [card["id"] for card in http.get("/v1/models").json()["data"]]
    listed = [option.get_attribute("value") for option in page.find_all("#model option")]
    compared = [option.get_attribute("value") for option in page.find_all("#compare-model option")]
    assert listed == models and compared == [""] + models
    assert not page.find("#key-row").is_displayed()  # this service asks for no key


@pytest.mark.parametrize("family", FAMILIES)
def test_a_text_is_shaded_where_and_as_the_api_scores_it(http, page, references, family):
    score(page, family, MIXED_TEXT)
    tokens = shown(page)
    answer = answer_of(http, scoring_body(family, MIXED_TEXT))
    assert_shown_as_answered(tokens, answer)
    ids = answer["choices"][0]["logprobs"]["token_ids"][:len(tokens)]
    rows = references[family].prompt_rows(ids)
    scored = [(t, rows[i][ids[i]]) for i, t in enumerate(tokens) if t["logprob"] is not None]
    np.testing.assert_allclose([t["logprob"] for t, _ in scored], [r for _, r in scored], atol=TOLERANCE)
    # The text reads as written: the pieces and the text between them, markers aside.
    written = page.script("""return [...document.querySelector("#views .tokens").childNodes]
        .filter((node) => !(node.classList && node.classList.contains("special")))
        .map((node) => node.textContent).join("")""")
    assert written == MIXED_TEXT
    # Shaded by log-probability: the scale is brighter where the model was surer.
    by_logprob = sorted((t for t, _ in scored), key=lambda t: t["logprob"])
    brightness = [luminance(t["colour"]) for t in by_logprob]
    assert all(later >= earlier - 1 for earlier, later in zip(brightness, brightness[1:])), brightness
    assert all(t["unscored"] for t in tokens if t["logprob"] is None)


def test_the_readme_sentence_with_paris_shaded_and_its_alternatives_on_hover_and_focus(
        http, page, screenshots):
    score(page, SMOLLM2, README_TEXT)
    answer = answer_of(http, scoring_body(SMOLLM2, README_TEXT))
    logprobs, rows = answer["choices"][0]["logprobs"], answer["choices"][0]["prompt_logprobs"]
    paris = logprobs["tokens"].index(" Paris")
    spans = page.find_all("#views .token")
    ActionChains(page.driver).move_to_element(spans[paris]).perform()
    tip = page.visible("#tooltip")
    assert f'" Paris" (id {logprobs["token_ids"][paris]})' in tip.text
    assert_alternatives(page, rows[paris])
    page.screenshot(screenshots / "viewer-text.png")
    # Keyboard: the next token by Tab from " Paris".
    spans[paris].send_keys(Keys.TAB)
    page.wait_for(lambda _: page.find("#tooltip").text.startswith("token\n\".\""))
    assert_alternatives(page, rows[paris + 1])
    spans[paris + 1].send_keys(Keys.ESCAPE)
    assert not page.find("#tooltip").is_displayed()


def assert_alternatives(page, row: dict) -> None:
    """The tooltip's table is the answer's prompt_logprobs row: rank, text, logprob."""
    table = page.find_all("#tooltip .alternatives tr")
    shown_rows = [[cell.text for cell in tr.find_elements("css selector", "td")] for tr in table]
    expected = sorted(row.values(), key=lambda entry: entry["rank"])
    assert [[int(rank), json.loads(text)] for rank, text, _ in shown_rows] == \
        [[e["rank"], e["decoded_token"]] for e in expected]
    np.testing.assert_allclose([float(value) for *_, value in shown_rows],
                               [e["logprob"] for e in expected], atol=1e-4)


def test_a_selected_span_is_scored_alone(http, page, screenshots):
    score(page, MODEL, "One sentence before the span, then the span itself, and after it more words.")
    spans = page.find_all("#views .token")
    first, last = 5, 9
    # A mouse drag from inside the first token to inside the last.
    ActionChains(page.driver).move_to_element(spans[first]).click_and_hold() \
        .move_to_element(spans[last]).release().perform()
    page.wait_for(lambda _: page.find("#score-span").is_enabled())
    assert page.find("#score-span").text == f"Score tokens {first}–{last} alone"
    whole = shown(page)
    click_and_wait(page, "#score-span")
    tokens = shown(page)
    ids = page.script("return state.results[0].scores.map((t) => t.id)")
    span = answer_of(http, {"model": MODEL, "prompt": ids[:last + 1], "logprob_start_len": first,
                            "max_tokens": 1, "temperature": 0, "logprobs": K})
    expected = span["choices"][0]["logprobs"]["token_logprobs"][:last - first + 1]
    inside = [t for t in tokens if first <= t["index"] <= last]
    np.testing.assert_allclose([t["logprob"] for t in inside], expected, atol=TOLERANCE)
    np.testing.assert_allclose(expected, [t["logprob"] for t in whole[first:last + 1]], atol=TOLERANCE)
    assert all(t["unscored"] for t in tokens if not first <= t["index"] <= last)
    assert [t["offset"] for t in tokens] == [t["offset"] for t in whole]  # in place in the text
    totals = page.find("#views .totals")
    assert float(totals.get_attribute("data-sum")) == pytest.approx(sum(expected), abs=1e-3)
    assert page.find("#views .total-count").text == str(last - first + 1)
    mean = sum(expected) / len(expected)
    assert float(page.find("#views .total-perplexity").text) == pytest.approx(math.exp(-mean), rel=1e-3)
    page.screenshot(screenshots / "viewer-span.png")
    page.find("#score-whole").click()
    assert [t["logprob"] for t in shown(page)] == [t["logprob"] for t in whole]


def test_labels_get_a_bar_each_with_the_api_s_probabilities(http, page, screenshots):
    Select(page.find("#model")).select_by_value(SMOLLM2)
    fill(page, "#text", "The capital of France is")
    labels = [" Paris", " London", " Rome", " Berlin and more"]
    fill(page, "#labels", "\n".join(labels))
    click_and_wait(page, "#score-labels")
    bars = page.find_all("#label-bars .label")
    assert [json.loads(bar.find_element("css selector", ".label-name").text) for bar in bars] == labels
    first_ids = [http.post("/tokenize", json={"model": SMOLLM2, "prompt": label, "add_special_tokens": False})
                 .json()["tokens"][0] for label in labels]
    answer = answer_of(http, {"model": SMOLLM2, "prompt": "The capital of France is", "max_tokens": 1,
                              "temperature": 0, "logprob_token_ids": first_ids})
    by_text = answer["choices"][0]["logprobs"]["top_logprobs"][0]
    pieces = [http.post("/detokenize", json={"model": SMOLLM2, "tokens": [i]}).json()["prompt"]
              for i in first_ids]
    np.testing.assert_allclose([float(bar.get_attribute("data-logprob")) for bar in bars],
                               [by_text[piece] for piece in pieces], atol=TOLERANCE)
    widths = [bar.find_element("css selector", ".label-bar").size["width"] for bar in bars]
    assert widths.index(max(widths)) == 0  # " Paris"
    assert "by its first token" in bars[3].text and "by its first token" not in bars[0].text
    page.screenshot(screenshots / "viewer-labels.png")


def compared(http, page, model: str, other: str, text: str) -> tuple[list[dict], list[float]]:
    """`text` scored on two models side by side, each view as the API answers it and headed
    by its model, then their difference: the first view's tokens, and other's logprob minus
    model's at each scored position."""
    score(page, model, text, compare=other)
    first, second = shown(page, 0), shown(page, 1)
    assert_shown_as_answered(first, answer_of(http, scoring_body(model, text)))
    assert_shown_as_answered(second, answer_of(http, scoring_body(other, text)))
    headings = [h.text for h in page.find_all("#views h2")]
    assert headings == [model, other, f"difference: {other} − {model}"]
    return first, [b["logprob"] - a["logprob"] for a, b in zip(first, second, strict=True)
                   if a["logprob"] is not None]


def test_two_models_side_by_side_coloured_by_their_difference(http, page, screenshots):
    text = "Two models read the same words and disagree about some of them."
    first, gaps = compared(http, page, MODEL, TINY_SIBLING, text)
    difference = shown(page, 2)
    assert min(gaps) < -0.5 and max(gaps) > 0.5  # the two models do disagree
    for token, gap in zip([t for t in difference if t["logprob"] is not None], gaps, strict=True):
        r, _, b = (float(c) for c in token["colour"][token["colour"].index("(") + 1:-1].split(",")[:3])
        if abs(gap) > 0.5:  # purple where the second model is surer, orange where less
            assert (b > r) == (gap > 0), (token, gap)
    ActionChains(page.driver).move_to_element(page.find_all("#views .view")[2]
                                              .find_elements("css selector", ".token")[3]).perform()
    tip = page.visible("#tooltip").text
    assert f"{MODEL}\n{first[3]['logprob']:.4f}" in tip and f"difference\n{gaps[2]:.4f}" in tip
    page.screenshot(screenshots / "viewer-compare.png")
    # Two tokenizers: each shaded on its own, and no difference made up.
    score(page, MODEL, text, compare=TINY_BOS)
    assert len(page.find_all("#views .view")) == 2
    assert "tokenize this text differently" in page.find("#views .note").text


def test_an_adapter_beside_its_base_model_shows_what_the_adapter_changed(http, page):
    text = "An adapter and the model it adapts read the same words."
    _, gaps = compared(http, page, MODEL, ADAPTERS[MODEL][0], text)
    assert max(map(abs, gaps)) > 0.05  # the adapter does change the scores


def test_chat_messages_are_scored_as_the_template_renders_them(http, page, screenshots):
    Select(page.find("#model")).select_by_value(SMOLLM2)
    page.find("input[name=input-kind][value=chat]").click()
    contents = page.find_all("#messages textarea")
    assert len(contents) == 2  # a user's question and an answer to start from
    click_and_wait(page, "#score")
    messages = page.script("return chatMessages()")
    ids = http.post("/tokenize", json={"model": SMOLLM2, "messages": messages,
                                       "add_generation_prompt": False}).json()["tokens"]
    answer = answer_of(http, scoring_body(SMOLLM2, ids))
    tokens = shown(page)
    assert_shown_as_answered(tokens, answer)
    assert "<|im_start|>user" in page.find("#views .tokens").text
    page.screenshot(screenshots / "viewer-chat.png")


def test_a_conversation_s_final_reply_is_scored_as_the_api_scores_it(http, page, screenshots):
    Select(page.find("#model")).select_by_value(SMOLLM2)
    Select(page.find("#compare-model")).select_by_value("")
    page.find("input[name=input-kind][value=chat]").click()
    click_and_wait(page, "#score-reply")
    assert not page.find("#error").is_displayed(), page.find("#error").text
    messages = page.script("return chatMessages()")
    response = http.post("/v1/chat/completions", json={
        "model": SMOLLM2, "messages": messages, "score_final_message": True, "top_logprobs": K,
        "max_tokens": 1, "temperature": 0, "add_generation_prompt": False})
    assert response.status_code == 200, response.text
    final = response.json()["final_message_logprobs"]
    tokens = shown(page)
    expected = [(entry["text_offset"], entry["token"]) for entry in final["content"]]
    assert [(t["offset"], t["piece"]) for t in tokens] == expected
    np.testing.assert_allclose([t["logprob"] for t in tokens], [e["logprob"] for e in final["content"]],
                               atol=TOLERANCE)
    # The reply's text alone, its tokens covering it, and their sum as the API adds them up.
    assert page.find("#views .tokens").text == messages[-1]["content"]
    total = float(page.find("#views .totals").get_attribute("data-sum"))
    assert total == pytest.approx(final["logprob_sum"], abs=TOLERANCE * len(tokens))
    page.screenshot(screenshots / "viewer-final-reply.png")


def test_a_long_text_renders_every_token(http, page):
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_path(SMOLLM2))
    ids = tokenizer.encode(" ".join(f"item {i} of the list reads {i * 7 % 13} words" for i in range(400)))
    count = LONG_TEXT_TOKENS
    while len(tokenizer.encode(text := tokenizer.decode(ids[:count]))) > LONG_TEXT_TOKENS:
        count -= 1
    Select(page.find("#model")).select_by_value(SMOLLM2)
    page.script("document.getElementById('text').value = arguments[0]", text)
    click_and_wait(page, "#score")
    tokens = page.script("return document.querySelectorAll('#views .token').length")
    answer = answer_of(http, scoring_body(SMOLLM2, text))
    # Every token shown (how fast the page renders them: bench/viewer_render.py).
    assert tokens == answer["usage"]["prompt_tokens"] >= LONG_TEXT_TOKENS - 4


def test_the_answer_exports_as_json_and_csv(page):
    score(page, MODEL, README_TEXT)
    tokens = shown(page)
    page.find("#export-json").click()
    exported_json = downloaded(page, "probserve-scores.json")
    page.find("#export-csv").click()
    exported_csv = downloaded(page, "probserve-scores.csv")
    (result,) = json.loads(exported_json)
    assert result["model"] == MODEL
    logprobs = result["answer"]["choices"][0]["logprobs"]
    assert logprobs["token_logprobs"][:len(tokens)] == [t["logprob"] for t in tokens]
    rows = list(csv.DictReader(exported_csv.splitlines()))
    assert [row["token"] for row in rows] == [t["piece"] for t in tokens]
    logprobs = [float(row["logprob"]) if row["logprob"] else None for row in rows]
    assert logprobs == [t["logprob"] for t in tokens]
    assert all(row["model"] == MODEL and row["alternatives"] for row in rows[1:])


def downloaded(page, name: str) -> str:
    path = page.downloads / name
    page.wait_for(lambda _: path.exists() and path.stat().st_size > 0, timeout=20)
    text = path.read_text(encoding="utf-8")
    path.unlink()
    return text


def test_a_refusal_shows_the_envelope(http, page):
    too_long = " ".join(["word"] * (2 * MAX_MODEL_LEN))
    Select(page.find("#model")).select_by_value(MODEL)
    page.script("document.getElementById('text').value = arguments[0]", too_long)
    click_and_wait(page, "#score")
    refused = http.post("/v1/completions", json=scoring_body(MODEL, too_long)).json()["error"]
    box = page.visible("#error")
    assert box.get_attribute("data-code") == refused["code"]
    assert box.text == f"400 {refused['code']}: {refused['message']}"
