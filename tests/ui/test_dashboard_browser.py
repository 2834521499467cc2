"""The dashboard in a real browser (Debian's Chromium driven by Playwright), walked as an operator
walks the loop on a real `reef serve` with its evolve worker on the tiny model: traffic through
the openai SDK, feedback reports, records and a session appear, an evolve makes a candidate,
the operator approves it, the new head serves, the operator rolls back. A scenario token then
sees only its scenario and no admin action.

With REEF_UI_SCREENSHOTS=<dir> (`make screenshots`), each page is also saved there as a PNG at
1280x800, and the overview and a transcript at phone width.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from reef.api.auth import hash_token
from reef.testing.process import ReefServer
from tests.reefserver import wait_for

pytestmark = [pytest.mark.ui, pytest.mark.timeout(1500)]

CHROMIUM = os.environ.get("REEF_CHROMIUM", "/usr/bin/chromium")
ADMIN, ALICE = "ui-browser-admin", "ui-browser-alice"
SHOP, SECRET = "shop", "secret"
SHOTS = os.environ.get("REEF_UI_SCREENSHOTS")
HARNESS = {
    "AGENTS.md": "You are the shop's assistant. Answer in at most five words.",
    "harness.json": json.dumps({"inject": True}),
}


@pytest.fixture(scope="module")
def reef(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReefServer]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    tmp = tmp_path_factory.mktemp("ui-browser")
    cfg = tmp / "cfg.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "auth": {
                    "tokens": [
                        {"name": "ops", "sha256": hash_token(ADMIN), "admin": True},
                        {"name": "alice", "sha256": hash_token(ALICE), "scenarios": [SHOP]},
                    ]
                },
                "reef": {"recipe": "sft", "batch_size": 2, "params": {"epochs": 1}},
                # both reports train: with none held out, 2 reports always make a batch
                "gate": {"policy": "manual", "approval_timeout_s": 600, "holdout": 0.0},
            }
        )
    )
    env = {"REEF_REEF__AUTO": "true"}
    with ReefServer(tmp / "state", "-c", str(cfg), "--model", "tiny", env=env) as srv:
        yield srv


def _admin(srv: ReefServer) -> httpx.Client:
    return httpx.Client(base_url=srv.url, headers={"authorization": f"Bearer {ADMIN}"}, timeout=120)


def _chat(srv: ReefServer, scenario: str, messages: list[dict[str, str]]) -> Any:
    client = openai.OpenAI(
        base_url=f"{srv.url}/v1",
        api_key=ADMIN,
        default_headers={"x-reef-scenario": scenario},
        max_retries=0,
    )
    with client:
        return client.chat.completions.with_raw_response.create(
            model="tiny", messages=messages, max_tokens=4, logprobs=True, top_logprobs=1
        )


def _pending(srv: ReefServer, scenario: str) -> list[dict[str, Any]]:
    with _admin(srv) as http:
        r = http.get(f"/reef/scenarios/{scenario}/candidates", params={"status": "pending"})
    return list(r.json()["data"]) if r.status_code == 200 else []


def _shot(page: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"ui-{name}.png"), full_page=False)


def test_operator_walks_the_loop(reef: ReefServer) -> None:
    from playwright.sync_api import sync_playwright

    first, harness_head = _traffic_with_feedback(reef)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            ctx = browser.new_context(viewport={"width": 1280, "height": 800})
            page = ctx.new_page()
            page.on("dialog", lambda d: d.accept())
            page.set_default_timeout(30_000)
            _sign_in(page, reef)
            _records_and_a_session(page)
            cand_id = _evolve_and_approve(page, reef)
            _roll_back(page, reef, cand_id, harness_head)
            _harness_diff_and_a_job(page, reef)
            _learning_records_and_overview(page, reef, first)
            _skip_link_first(page, reef)
            _scenario_token_sees_its_own(browser, reef, harness_head)
        finally:
            browser.close()
    if SHOTS:
        print(f"screenshots in {SHOTS}: {sorted(p.name for p in Path(SHOTS).glob('ui-*.png'))}")


def _traffic_with_feedback(reef: ReefServer) -> tuple[str, str]:
    """A harness the head injects, a two-turn session and a single question in SHOP with
    feedback on each, a question in SECRET. Returns the first record's id and the harness
    release."""
    with _admin(reef) as http:
        # a harness the head injects: every transcript shows what it added
        r = http.post(f"/reef/scenarios/{SHOP}/harness", json={"files": HARNESS})
        assert r.status_code == 201, r.text
        # traffic: a two-turn session, then a single question; feedback on each receipt
        first = [{"role": "user", "content": "Where is my parcel?"}]
        one = _chat(reef, SHOP, first)
        answer = one.parse().choices[0].message.content or ""
        follow = [*first, {"role": "assistant", "content": answer}]
        two = _chat(reef, SHOP, [*follow, {"role": "user", "content": "And the refund?"}])
        three = _chat(reef, SHOP, [{"role": "user", "content": "Do you ship abroad?"}])
        _chat(reef, SECRET, [{"role": "user", "content": "classified question"}])
        for raw, score in ((one, 1.0), (two, 0.5), (three, 1.0)):
            rid = raw.headers["x-reef-agent-record-id"]
            body = {"references": [rid], "score": score, "feedback": {"correction": "Soon."}}
            http.post(
                "/reef/report", json=body, headers={"x-reef-scenario": SHOP}
            ).raise_for_status()
        harness_head = http.get(f"/reef/scenarios/{SHOP}").json()["head_release_id"]
    return one.headers["x-reef-agent-record-id"], harness_head


def _sign_in(page: Any, reef: ReefServer) -> None:
    """The dashboard sends us to the form first; signed in, the overview lists both
    scenarios."""
    from playwright.sync_api import expect

    page.goto(f"{reef.url}/ui")
    expect(page).to_have_url(re.compile(r"/ui/login"))
    _shot(page, "login")
    page.get_by_label("Token").fill(ADMIN)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Scenarios")).to_be_visible()
    row = page.get_by_role("row").filter(has_text=SHOP)
    expect(row).to_contain_text("#1 harness")
    expect(page.get_by_role("rowheader", name=SECRET)).to_be_visible()


def _records_and_a_session(page: Any) -> None:
    """Records, filtered, then the session's transcript with its reports and injection."""
    from playwright.sync_api import expect

    page.get_by_role("link", name=SHOP, exact=True).click()
    expect(page.get_by_role("heading", name="Records")).to_be_visible()
    expect(page.locator("table.records")).to_contain_text("And the refund?")
    expect(page.locator("table.records")).to_contain_text("Where is my parcel?")
    page.get_by_label("Text in prompt or answer").fill("refund")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("table.records tbody tr")).to_have_count(1)
    page.locator("table.records tbody tr a").first.click()
    expect(page.get_by_role("heading", name=re.compile("Session"))).to_be_visible()
    expect(page.locator("li.turn")).to_have_count(2)
    expect(page.locator("li.turn").nth(1)).to_contain_text("score 0.50")
    expect(page.locator("li.turn").first).to_contain_text("Harness injection")
    expect(page.locator(".heat").first).to_be_visible()
    _shot(page, "session")


def _evolve_and_approve(page: Any, reef: ReefServer) -> str:
    """Ask the worker to evolve; the candidate appears on the candidates page by itself; the
    operator approves it and the new head serves. Returns the candidate's id."""
    from playwright.sync_api import expect

    page.get_by_role("link", name="Jobs").click()
    page.get_by_role("button", name="Evolve now").click()
    expect(page.get_by_role("status")).to_contain_text("evolve requested")
    page.get_by_role("link", name="Candidates").click()
    approve = page.get_by_role("button", name="Approve and release")

    def pending() -> list[dict[str, Any]]:
        return _pending(reef, SHOP)

    wait_for("a pending candidate", pending, reef, timeout=600)
    expect(approve).to_be_visible(timeout=15_000)  # the section refreshes itself
    expect(page.locator("#pending")).to_contain_text("sft")
    _shot(page, "candidates")
    cand_id = page.locator("#pending article.candidate").first.get_attribute("id")
    assert cand_id and cand_id.startswith("rel_")
    approve.click()
    expect(page.get_by_role("status")).to_contain_text(f"{cand_id} is the head")
    expect(page.locator(f"li.release.head#{cand_id}")).to_contain_text("approved")
    expect(page.locator(f"li.release.head#{cand_id}")).to_contain_text("by ops")

    # the new head serves
    served = _chat(reef, SHOP, [{"role": "user", "content": "Is the new head here?"}])
    assert served.headers["x-reef-release-id"] == cand_id
    return str(cand_id)


def _roll_back(page: Any, reef: ReefServer, cand_id: str, harness_head: str) -> None:
    """Roll back to the harness release: a new head, serving at once."""
    from playwright.sync_api import expect

    page.get_by_role("button", name=re.compile(r"Roll back to #1$")).click()
    expect(page.get_by_role("status")).to_contain_text("rolled back")
    head = page.locator("li.release.head")
    expect(head).to_contain_text("rollback")
    rolled = head.get_attribute("id")
    assert rolled and rolled not in (cand_id, harness_head)
    served = _chat(reef, SHOP, [{"role": "user", "content": "And now?"}])
    assert served.headers["x-reef-release-id"] == rolled
    _shot(page, "releases")


def _harness_diff_and_a_job(page: Any, reef: ReefServer) -> None:
    """A harness change shows as a diff against its parent; an instruction job's progress
    shows on the jobs page until it ends."""
    from playwright.sync_api import expect

    with _admin(reef) as http:
        edits = [{"op": "update", "path": "AGENTS.md", "content": "Answer in one word."}]
        r = http.post(f"/reef/scenarios/{SHOP}/harness", json={"edits": edits})
        assert r.status_code == 201, r.text
        harness2 = r.json()["release_id"]
        # an instruction job, to watch its progress on the jobs page
        job = http.post(
            "/reef/train",
            json={"text": "Greet the customer first."},
            headers={"x-reef-scenario": SHOP},
        )
        assert job.status_code == 202, job.text
    page.goto(f"{reef.url}/ui/s/{SHOP}/diff/{harness2}")
    expect(page.locator(".diff-file")).to_contain_text("AGENTS.md")
    expect(page.locator("pre.diff .add")).to_contain_text("Answer in one word.")
    _shot(page, "diff")

    page.goto(f"{reef.url}/ui/s/{SHOP}/jobs")
    expect(page.locator("article.job").first).to_contain_text(
        re.compile("done|failed"), timeout=600_000
    )
    expect(page.locator("article.job").first).to_contain_text("Greet the customer first.")
    _shot(page, "jobs")


def _learning_records_and_overview(page: Any, reef: ReefServer, first: str) -> None:
    """The learning chart draws; the overview's readiness cell loads (and, for the
    screenshots, the pages at phone width)."""
    from playwright.sync_api import expect

    page.goto(f"{reef.url}/ui/s/{SHOP}/curves")
    expect(page.locator("#curve canvas")).to_be_visible()
    _shot(page, "curves")
    page.goto(f"{reef.url}/ui/s/{SHOP}/records")
    _shot(page, "records")
    page.goto(f"{reef.url}/ui")
    expect(page.locator("[data-load]").first).to_contain_text("/")
    _shot(page, "overview")
    if SHOTS:
        page.set_viewport_size({"width": 390, "height": 844})
        _shot(page, "overview-phone")
        page.goto(f"{reef.url}/ui/s/{SHOP}/records/{first}")
        _shot(page, "session-phone")


def _skip_link_first(page: Any, reef: ReefServer) -> None:
    """Keyboard: the skip link is the first stop and lands on the content."""
    from playwright.sync_api import expect

    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"{reef.url}/ui")
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()


def _scenario_token_sees_its_own(browser: Any, reef: ReefServer, harness_head: str) -> None:
    """A scenario token: its scenario only, and no admin action, shown or done."""
    from playwright.sync_api import expect

    scoped = browser.new_context(viewport={"width": 1280, "height": 800})
    alice = scoped.new_page()
    alice.goto(f"{reef.url}/ui/login")
    alice.get_by_label("Token").fill(ALICE)
    alice.get_by_role("button", name="Sign in").click()
    expect(alice.get_by_role("rowheader", name=SHOP)).to_be_visible()
    expect(alice.get_by_role("rowheader", name=SECRET)).to_have_count(0)
    answer_403 = alice.goto(f"{reef.url}/ui/s/{SECRET}/records")
    assert answer_403 is not None and answer_403.status == 403
    expect(alice.locator("body")).not_to_contain_text("classified question")
    alice.goto(f"{reef.url}/ui/s/{SHOP}/releases")
    expect(alice.locator("li.release").first).to_be_visible()
    expect(alice.get_by_role("button", name=re.compile("Roll back"))).to_have_count(0)
    alice.goto(f"{reef.url}/ui/s/{SHOP}/candidates")
    expect(alice.get_by_role("button", name="Approve and release")).to_have_count(0)
    alice.goto(f"{reef.url}/ui/s/{SHOP}/jobs")
    expect(alice.get_by_role("button", name="Evolve now")).to_have_count(0)
    # forging the form from the page itself: refused server-side
    status = alice.evaluate(
        """async ([url, release]) => {
            const csrf = document.querySelector('input[name=csrf]').value;
            const body = new URLSearchParams({csrf, release_id: release});
            const r = await fetch(url, {method: 'POST', body});
            return r.status;
        }""",
        [f"/ui/s/{SHOP}/rollback", harness_head],
    )
    assert status == 403
    scoped.close()
