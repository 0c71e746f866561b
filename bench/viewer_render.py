"""The viewer's rendering time: a long text scored in /ui, in headless Chromium driven by
Selenium (Debian's `chromium` and `chromium-driver`, as the viewer's tests use them), on
probserve with the embedded SmolLM2; for each run, the tokens shown and the milliseconds the
page took to render them (its `data-render-ms`). tests/e2e/test_viewer.py checks that every
token is shown, not how fast.

    .venv/bin/python bench/viewer_render.py                       # 2,047 tokens, 3 runs
    .venv/bin/python bench/viewer_render.py --tokens 1000 --repeats 5
"""

import argparse
import shutil
import statistics
from pathlib import Path

from load import probserve_serving
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait
from transformers import AutoTokenizer

from serve_app.store.model_store import SMOLLM2, embedded_model_path

WAIT_S = 300


def long_text(tokens: int) -> str:
    """A list's text of at most `tokens` SmolLM2 tokens, as the viewer's test builds it."""
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_path(SMOLLM2))
    ids = tokenizer.encode(" ".join(f"item {i} of the list reads {i * 7 % 13} words" for i in range(tokens)))
    count = tokens
    while len(tokenizer.encode(text := tokenizer.decode(ids[:count]))) > tokens:
        count -= 1
    return text


def chromium() -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1280,1000"):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=Service(executable_path=shutil.which("chromedriver")))


def rendered(driver: webdriver.Chrome, url: str, text: str) -> tuple[int, float]:
    """`text` scored in a fresh page: the tokens it shows and the milliseconds it took to render them."""
    driver.get(f"{url}/ui/")
    wait = WebDriverWait(driver, WAIT_S)
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#model").get_attribute("value"))
    Select(driver.find_element(By.CSS_SELECTOR, "#model")).select_by_value(SMOLLM2)
    driver.execute_script("document.getElementById('text').value = arguments[0]", text)
    driver.find_element(By.CSS_SELECTOR, "#score").click()
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#status").text.endswith("done")
               or d.find_element(By.CSS_SELECTOR, "#error").is_displayed())
    assert not driver.find_element(By.CSS_SELECTOR, "#error").is_displayed(), \
        driver.find_element(By.CSS_SELECTOR, "#error").text
    shown = driver.execute_script("return document.querySelectorAll('#views .token').length")
    return shown, float(driver.find_element(By.CSS_SELECTOR, "#results").get_attribute("data-render-ms"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2047, help="of the text: SmolLM2's context less one")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--config", type=Path, default=Path("deployments/local.yaml"))
    options = parser.parse_args()
    with probserve_serving(options.config) as url:
        text, driver = long_text(options.tokens), chromium()
        try:
            runs = [rendered(driver, url, text) for _ in range(options.repeats)]
        finally:
            driver.quit()
    for shown, ms in runs:
        print(f"{shown} tokens rendered in {ms:.0f} ms")
    print(f"median {statistics.median(ms for _, ms in runs):.0f} ms over {len(runs)} runs")


if __name__ == "__main__":
    main()
