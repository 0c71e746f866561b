"""The viewer's files as the ingress serves them: each with its type and a strict
Content-Security-Policy, nothing else, and nothing at all when the config switches it off; and
the page itself written so that policy lets it run."""

import re
import tomllib
from fnmatch import fnmatch
from importlib import resources
from pathlib import Path

import pytest

from serve_app.config import IngressConfig
from serve_app.errors import APIError
from serve_app.front.viewer import CONTENT_SECURITY_POLICY, MEDIA_TYPES, ViewerFiles

UI = resources.files("serve_app.ui")
PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"


@pytest.mark.parametrize("name", sorted(MEDIA_TYPES))
def test_each_file_goes_out_with_its_type_and_the_policy(name):
    response = ViewerFiles(enabled=True).response(name)
    assert response.status_code == 200
    assert response.media_type == MEDIA_TYPES[name]
    assert response.body == UI.joinpath(name).read_bytes()
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert response.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize("name", ["secret.py", "__init__.py", "../config.py", "", "index.htm"])
def test_nothing_else_is_served(name):
    with pytest.raises(APIError) as refused:
        ViewerFiles(enabled=True).response(name)
    assert (refused.value.status, refused.value.code) == (404, "not_found")


def test_switched_off_serves_nothing_and_says_why():
    viewer = ViewerFiles(enabled=False)
    for call in (viewer.check_enabled, lambda: viewer.response("index.html")):
        with pytest.raises(APIError) as refused:
            call()
        assert (refused.value.status, refused.value.code) == (404, "not_found")
        assert "ingress.ui: false" in refused.value.message


def test_the_config_switch():
    assert IngressConfig().ui is True
    assert IngressConfig(ui=False).ui is False


def test_the_policy_allows_this_origin_only():
    directives = dict(d.strip().split(" ", 1) for d in CONTENT_SECURITY_POLICY.split(";"))
    assert directives["default-src"] == "'none'"
    for kind in ("script-src", "style-src", "connect-src"):
        assert directives[kind] == "'self'", kind
    assert "unsafe" not in CONTENT_SECURITY_POLICY


def test_the_page_has_nothing_the_policy_blocks_or_fetches_from_elsewhere():
    page = UI.joinpath("index.html").read_text()
    assert re.findall(r"<script\b[^>]*>", page) == ['<script src="viewer.js" defer>']
    assert re.search(r"<style\b|\sstyle=|\son[a-z]+=", page) is None
    assert re.search(r"(src|href)=\"(https?:)?//", page) is None
    script = UI.joinpath("viewer.js").read_text()
    # No markup from strings (the answers hold any text) and no code from strings.
    unsafe = r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|new Function"
    assert re.search(unsafe, script) is None
    assert re.search(r"https?://", script) is None


def test_every_file_of_the_page_ships_in_the_package():
    patterns = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["package-data"]["serve_app.ui"]
    for name in MEDIA_TYPES:
        assert any(fnmatch(name, pattern) for pattern in patterns), name
    assert {p.name for p in Path(str(UI)).iterdir() if p.suffix != ".py" and p.is_file()} <= set(MEDIA_TYPES)
