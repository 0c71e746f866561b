"""Headless Chromium (Debian's `chromium` and `chromium-driver`, installed by `make test`)
driven by Selenium, for the viewer's tests."""

import pathlib
import shutil

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

# A page action waits at most this long: the answers come from vLLM on a loaded CPU.
WAIT_S = 120


class Browser:
    def __init__(self, downloads: pathlib.Path):
        chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
        assert chromium and driver, "chromium and chromedriver are not installed: `make test` installs them"
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                         "--window-size=1280,1000", "--force-device-scale-factor=1"):
            options.add_argument(argument)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(options=options, service=Service(executable_path=driver))
        self.downloads = downloads
        self.driver.execute_cdp_cmd("Browser.setDownloadBehavior",
                                    {"behavior": "allow", "downloadPath": str(downloads)})

    def open(self, url: str) -> None:
        self.driver.get(url)
        self.wait_for(lambda d: d.execute_script("return document.readyState") == "complete")

    def wait_for(self, condition, timeout: float = WAIT_S):
        return WebDriverWait(self.driver, timeout).until(condition)

    def find(self, css: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def find_all(self, css: str) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def visible(self, css: str) -> WebElement:
        return self.wait_for(expected_conditions.visibility_of_element_located((By.CSS_SELECTOR, css)))

    def script(self, source: str, *args):
        return self.driver.execute_script(source, *args)

    def console_errors(self) -> list[str]:
        return [entry["message"] for entry in self.driver.get_log("browser") if entry["level"] == "SEVERE"]

    def screenshot(self, path: pathlib.Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        assert self.driver.save_screenshot(str(path)), f"no screenshot written to {path}"

    def quit(self) -> None:
        self.driver.quit()
