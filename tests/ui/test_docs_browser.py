"""The API docs offline, in a real browser (Debian's Chromium driven by Playwright): /docs
(Swagger UI) and /redoc (ReDoc) render the operations with every request to anywhere but this
server aborted, ask for nothing elsewhere (no CDN script, no font, no validator badge), and run
under their Content-Security-Policy with no violation or script error."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from reef.cli.testing import InProcessReef

pytestmark = [pytest.mark.ui, pytest.mark.timeout(600)]

CHROMIUM = os.environ.get("REEF_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="module")
def reef(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with InProcessReef(tmp_path_factory.mktemp("ui-docs")) as srv:
        yield srv


class Offline:
    """A page whose requests reach only 127.0.0.1: the rest is aborted and remembered."""

    def __init__(self, page: Any):
        self.page = page
        self.elsewhere: list[str] = []
        self.problems: list[str] = []
        page.route("**/*", self._route)
        page.on("console", lambda m: self.problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.problems.append(str(e)))

    def _route(self, route: Any) -> None:
        url = route.request.url
        if urlsplit(url).hostname == "127.0.0.1":
            route.continue_()
        else:
            self.elsewhere.append(url)
            route.abort("internetdisconnected")

    def load(self, url: str) -> Any:
        answer = self.page.goto(url)
        assert answer is not None and answer.status == 200, url
        return answer


def test_docs_render_offline_under_their_policy(reef: InProcessReef) -> None:
    from playwright.sync_api import sync_playwright

    spec = httpx.get(f"{reef.url}/openapi.json").json()
    operations = sum(len(methods) for methods in spec["paths"].values())
    assert operations > 20
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            offline = Offline(browser.new_page())
            _swagger(offline, reef, operations)
            _redoc(offline, reef)
            assert offline.elsewhere == []
            # the browser's own favicon.ico aside (a 404 here), no error of any kind
            assert [p for p in offline.problems if "Failed to load resource" not in p] == []
        finally:
            browser.close()


def _swagger(offline: Offline, reef: InProcessReef, operations: int) -> None:
    answer = offline.load(f"{reef.url}/docs")
    policy = answer.headers["content-security-policy"]
    assert "script-src 'self';" in policy and "https:" not in policy
    assert answer.headers["x-frame-options"] == "DENY"
    page = offline.page
    page.wait_for_selector(".opblock", timeout=60_000)
    assert page.locator(".opblock").count() == operations
    assert page.locator(".opblock-summary-path", has_text="/v1/chat/completions").count() >= 1
    page.wait_for_load_state("networkidle")


def _redoc(offline: Offline, reef: InProcessReef) -> None:
    offline.load(f"{reef.url}/redoc")
    page = offline.page
    page.wait_for_selector("[data-section-id^='operation/']", timeout=60_000)
    assert page.locator("[data-section-id^='operation/']").count() > 20
    assert page.get_by_text("/v1/chat/completions").count() >= 1
    page.wait_for_load_state("networkidle")
    # no web font is asked for: headings fall back to the system's fonts
    fonts = page.evaluate("() => [...document.fonts].map(f => f.family)")
    assert fonts == [], fonts
