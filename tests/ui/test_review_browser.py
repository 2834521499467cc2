"""A reviewer works through the annotation queue in a real browser (Debian's Chromium driven by
Playwright) on a real `reef serve` with its evolve worker on the tiny model: eight turns served
through the openai SDK fill the queue (review.sample 1), the reviewer takes them one after the
other with the keyboard alone (1-5 to score, e to correct, Ctrl+Enter to save), correcting the
answers that break the rule (longer than MAX_WORDS words: the correction is a short answer).
The eight reviews make a batch; the worker trains sft on it and the gate (always) releases it;
the openai SDK is then answered by that release, and its dataset holds exactly the reviewer's
corrections as targets. The tiny model is random: what it learned is not checked, only that the
release trained on those corrections is the one served.

With REEF_UI_SCREENSHOTS=<dir> (`make screenshots`), the queue and the review view are saved
there as PNGs (the review view at phone width too)."""

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
from reef.artifacts import open_artifacts
from reef.datasets import dataset_key, load
from reef.testing.process import ReefServer
from tests.reefserver import wait_for

pytestmark = [pytest.mark.ui, pytest.mark.timeout(600)]

CHROMIUM = os.environ.get("REEF_CHROMIUM", "/usr/bin/chromium")
ADMIN, RITA = "rv-browser-admin", "rv-browser-rita"
SHOP = "shop"
TURNS = 8
MAX_WORDS = 3
SHORT = "Short answer."
SHOTS = os.environ.get("REEF_UI_SCREENSHOTS")


@pytest.fixture(scope="module")
def reef(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReefServer]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    tmp = tmp_path_factory.mktemp("ui-review")
    cfg = tmp / "cfg.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "auth": {
                    "tokens": [
                        {"name": "ops", "sha256": hash_token(ADMIN), "admin": True},
                        {
                            "name": "rita",
                            "sha256": hash_token(RITA),
                            "scenarios": [SHOP],
                            "reviewer": True,
                        },
                    ]
                },
                "reef": {"recipe": "sft", "batch_size": TURNS, "params": {"epochs": 1}},
                "gate": {"policy": "always", "holdout": 0.0},
                "scenarios": {SHOP: {"review": {"sample": 1.0}}},
            }
        )
    )
    env = {"REEF_REEF__AUTO": "true"}
    with ReefServer(tmp / "state", "-c", str(cfg), "--model", "tiny", env=env) as srv:
        yield srv


def _openai(srv: ReefServer) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{srv.url}/v1",
        api_key=ADMIN,
        default_headers={"x-reef-scenario": SHOP},
        max_retries=0,
    )


def _served(srv: ReefServer) -> dict[str, str]:
    """Eight turns, short and long answers in turn: record id -> answer."""
    out = {}
    with _openai(srv) as client:
        for i in range(TURNS):
            raw = client.chat.completions.with_raw_response.create(
                model="tiny",
                messages=[{"role": "user", "content": f"Question {i}: where is my parcel?"}],
                max_tokens=1 if i % 2 else 24,
            )
            out[raw.headers["x-reef-agent-record-id"]] = (
                raw.parse().choices[0].message.content or ""
            )
    return out


def _shot(page: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"ui-{name}.png"), full_page=False)


def _review_queue(page: Any, srv: ReefServer) -> dict[str, str]:
    """Sign in as the reviewer and work through the queue with the keyboard. Returns the
    corrections made: record id -> correction."""
    from playwright.sync_api import expect

    page.goto(f"{srv.url}/ui/s/{SHOP}/queue")
    page.get_by_label("Token").fill(RITA)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator('[data-count="open"]')).to_have_text(str(TURNS))
    _shot(page, "queue")
    page.get_by_role("button", name="Review the next turn").click()
    corrected: dict[str, str] = {}
    for n in range(TURNS):
        turn = page.locator("li.turn.current")
        expect(turn).to_be_visible()
        rid = turn.get_attribute("id")
        assert rid and rid not in corrected
        answer = turn.locator(".msg.role-assistant .body").inner_text()
        if n == 0:
            _shot(page, "review")
        if len(answer.split()) > MAX_WORDS:  # the rule: answers are short
            page.keyboard.press("e")
            page.keyboard.type(SHORT)
            page.keyboard.press("Escape")
            page.keyboard.press("1")
            corrected[rid] = SHORT
        else:
            page.keyboard.press("5")
        expect(turn.locator('input[name="score"]:checked')).to_have_count(1)
        with page.expect_navigation():  # saved: the next turn of the queue opens
            if n % 2:
                page.keyboard.press("Control+Enter")
            else:
                turn.get_by_role("button", name="Save review").click()
        expect(page.get_by_role("status")).to_contain_text("review saved as rpt_")
    expect(page.get_by_role("heading", name="Review queue")).to_be_visible()
    expect(page.locator('[data-count="done"]')).to_have_text(str(TURNS))
    return corrected


def test_a_reviewer_corrects_the_queue_and_the_next_release_learns_from_it(
    reef: ReefServer,
) -> None:
    from playwright.sync_api import sync_playwright

    answers = _served(reef)
    broken = {rid for rid, a in answers.items() if len(a.split()) > MAX_WORDS}
    assert broken and len(broken) < TURNS, answers  # some answers break the rule, not all
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(30_000)
            corrected = _review_queue(page, reef)
            if SHOTS:  # the review view at phone width
                phone = browser.new_page(viewport={"width": 390, "height": 844})
                phone.context.add_cookies(page.context.cookies())
                phone.goto(f"{reef.url}/ui/s/{SHOP}/records/{next(iter(answers))}")
                _shot(phone, "review-phone")
        finally:
            browser.close()
    assert set(corrected) == broken
    _the_corrections_are_served(reef, corrected)


def _the_corrections_are_served(reef: ReefServer, corrected: dict[str, str]) -> None:
    """The worker evolved on the eight reviews, the gate released the candidate, the openai
    SDK is answered by it, and its dataset's targets are the reviewer's corrections."""
    with httpx.Client(
        base_url=reef.url, headers={"authorization": f"Bearer {ADMIN}"}, timeout=60
    ) as http:

        def published() -> list[dict[str, Any]]:
            r = http.get(f"/reef/scenarios/{SHOP}/candidates", params={"status": "published"})
            return list(r.json()["data"]) if r.status_code == 200 else []

        [cand] = wait_for("a published candidate", published, reef, timeout=300)
        head = http.get(f"/reef/scenarios/{SHOP}").json()["head_release_id"]
    assert head == cand["release_id"] and cand["recipe"] == "sft"
    with _openai(reef) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": "Where is my parcel?"}]
        )
    assert raw.headers["x-reef-release-id"] == cand["release_id"]
    artifacts = open_artifacts(reef.state_dir / "artifacts")
    table = load(artifacts, dataset_key(SHOP, "scored", cand["dataset_id"])).to_pylist()
    assert len(table) == TURNS
    targets = {}
    for row in table:
        feedback = json.loads(row["feedback"]) if row["feedback"] else None
        if isinstance(feedback, dict) and "correction" in feedback:
            targets[row["sample_id"]] = feedback["correction"]
    assert targets == corrected
    assert all(re.fullmatch(r"rec_[0-9a-z]+", rid) for rid in targets)
