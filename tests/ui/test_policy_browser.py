"""The dashboard's security headers in a real browser (Debian's Chromium driven by Playwright):
another site's page cannot frame it, and every page works under its Content-Security-Policy
(scripts and styles from its own files only) with no violation or script error in the console.
No-token mode, where the framed buttons would need no sign-in."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from reef.cli.testing import InProcessReef

pytestmark = [pytest.mark.ui, pytest.mark.timeout(600)]

CHROMIUM = os.environ.get("REEF_CHROMIUM", "/usr/bin/chromium")
SHOP = "shop"


@pytest.fixture(scope="module")
def reef(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with InProcessReef(tmp_path_factory.mktemp("ui-policy")) as srv:
        yield srv


def _traffic(srv: InProcessReef) -> dict[str, str]:
    """A harness release, a two-turn session with log-probs (the heat strip) and reports."""
    http = httpx.Client(base_url=srv.url, headers={"x-reef-scenario": SHOP}, timeout=60)
    client = openai.OpenAI(
        base_url=srv.base_url, api_key="none", default_headers={"x-reef-scenario": SHOP}
    )
    with http, client:
        files = {"AGENTS.md": "Be brief.", "harness.json": json.dumps({"inject": True})}
        r = http.post(f"/reef/scenarios/{SHOP}/harness", json={"files": files})
        assert r.status_code == 201, r.text
        first = [{"role": "user", "content": "Where is my parcel?"}]
        one = client.chat.completions.with_raw_response.create(
            model="tiny", messages=first, max_tokens=4, logprobs=True, top_logprobs=1
        )
        answer = one.parse().choices[0].message.content or ""
        follow = [
            *first,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "?"},
        ]
        client.chat.completions.create(model="tiny", messages=follow, max_tokens=4)
        rid = one.headers["x-reef-agent-record-id"]
        http.post("/reef/report", json={"references": [rid], "score": 1.0}).raise_for_status()
        return {"record": rid, "harness": r.json()["release_id"]}


def _pages(srv: InProcessReef, ids: dict[str, str]) -> list[str]:
    s = f"{srv.url}/ui/s/{SHOP}"
    return [
        f"{srv.url}/ui",
        f"{s}/records",
        f"{s}/records?q=parcel&feedback=yes",
        f"{s}/records/{ids['record']}",  # the session's transcript, heat strip included
        f"{s}/releases",
        f"{s}/candidates",
        f"{s}/curves",
        f"{s}/jobs",
        f"{s}/settings",
        f"{s}/queue",
        f"{s}/diff/{ids['harness']}",
        f"{s}/archive",
        f"{s}/readiness",
        f"{s}/records/rec_none",  # the error page
    ]


def test_pages_work_under_the_policy_and_cannot_be_framed(reef: InProcessReef) -> None:
    from playwright.sync_api import sync_playwright

    ids = _traffic(reef)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page()
            problems: list[str] = []
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            failed: list[str] = []  # what the pages load; the browser's own favicon.ico aside
            page.on(
                "response",
                lambda r: (
                    failed.append(f"{r.status} {r.url}")
                    if r.status >= 400 and not r.url.endswith("/favicon.ico")
                    else None
                ),
            )
            for url in _pages(reef, ids):
                problems.clear()
                failed.clear()
                answer = page.goto(url)
                assert answer is not None and answer.headers["x-frame-options"] == "DENY"
                page.wait_for_load_state("networkidle")
                if url.endswith("rec_none"):  # the error page: its own answer is the 404
                    assert failed == [f"404 {url}"]
                else:
                    assert failed == [], url
                # a 404 is logged as "Failed to load resource" (checked above); anything
                # else (a refused script or style, a script error) is a problem
                problems = [p for p in problems if "Failed to load resource" not in p]
                assert problems == [], url
            _scripts_ran(page, reef)
            _framing_is_refused(page, reef)
        finally:
            browser.close()


def _scripts_ran(page: Any, reef: InProcessReef) -> None:
    """The dashboard's own scripts still do their work under the policy."""
    page.goto(f"{reef.url}/ui")
    cell = page.locator(f'td[data-load="/ui/s/{SHOP}/readiness"]')
    page.wait_for_function("el => el.textContent.trim() !== '…'", arg=cell.element_handle())
    assert cell.inner_text().strip() not in ("unavailable", "…")  # the fragment was fetched
    page.goto(f"{reef.url}/ui/s/{SHOP}/curves")
    page.wait_for_selector("#curve canvas")  # uPlot drew the curve


def _framing_is_refused(page: Any, reef: InProcessReef) -> None:
    """Another site's page framing the dashboard (its buttons under a transparent frame) gets
    an empty frame: the browser refuses to render it there. The other site is another port
    on loopback: a public one is also stopped by Chromium's local-network checks, which not
    every browser makes, and which would hide whether the headers work."""
    target = f"{reef.url}/ui/s/{SHOP}/releases"
    html = (
        "<!doctype html><title>win a prize</title>"
        f'<iframe id="f" src="{target}" width="800" height="600"></iframe>'
    ).encode()

    class Attacker(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(html)

        def log_message(self, *args: Any) -> None:
            pass

    attacker = ThreadingHTTPServer(("127.0.0.1", 0), Attacker)
    threading.Thread(target=attacker.serve_forever, daemon=True).start()
    answered: list[int] = []
    refused: list[str] = []
    messages: list[str] = []
    page.on("response", lambda r: answered.append(r.status) if r.url == target else None)
    page.on("requestfailed", lambda r: refused.append(r.failure) if r.url == target else None)
    page.on("console", lambda m: messages.append(m.text))
    try:
        page.goto(f"http://127.0.0.1:{attacker.server_port}/")
        page.wait_for_load_state("networkidle")
    finally:
        attacker.shutdown()
        attacker.server_close()
    assert answered == [200]  # the server answered the page...
    assert refused == ["net::ERR_BLOCKED_BY_RESPONSE"]  # ...for its headers, it was not shown
    assert any("frame-ancestors 'none'" in m for m in messages), messages
    assert page.frame_locator("#f").locator("a.brand").count() == 0
