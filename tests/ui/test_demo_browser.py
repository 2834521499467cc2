"""After a real `make demo` round, the dashboard says whether the agent got better (Chromium).

`python -m demo --no-guard --rounds 1` runs SmolLM2 through one round of 8 corrected reports
(the preference "at most five words"; minutes on two cores). Its measurements, the held-out pass
rate and the held-out answers still correct per release, are what the demo wrote as the
scenario's figures. A `reef serve` on the demo's state then shows them, and an operator's
browser must find, without clicking anything: on the overview, the pass rate's first and latest
value; on the learning page, the rise of the preference and the change in correctness, each
from the base release to the new one, drawn in the main chart.

No guard, so the candidate that buys the preference with correct answers is published and the
correctness drop is there to be shown (with the guard, `make demo` refuses it: the candidates
page shows the guard's numbers, a test of tests/api/test_ui_views.py).

With REEF_UI_SCREENSHOTS=<dir> (`make screenshots`), the overview and the learning page of this
real run are saved there (docs/ui.md shows them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reef.api.ui.views.text import num
from reef.testing.process import ReefServer

pytestmark = [pytest.mark.demo, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("REEF_CHROMIUM", "/usr/bin/chromium")
SHOTS = os.environ.get("REEF_UI_SCREENSHOTS")
SCENARIO = "five-words"


def _figure(state: Path, name: str) -> list[float]:
    body = json.loads((state / "artifacts" / "figures" / SCENARIO / f"{name}.json").read_text())
    return [float(p["value"]) for p in body["points"]]


def _shot(page: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SHOTS) / f"ui-{name}.png"), full_page=False)


def _demo_round(state: Path) -> tuple[list[float], list[float]]:
    """One demo round without the guard: the held-out pass rate and correctness per release."""
    run = subprocess.run(
        [sys.executable, "-m", "demo", "--no-guard", "--rounds", "1", "--state-dir", str(state)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert run.returncode == 0, f"the demo did not reach its target:\n{run.stdout[-4000:]}"
    passed, correct = _figure(state, "held-out-pass-rate"), _figure(state, "held-out-correct")
    assert len(passed) == len(correct) == 2
    assert passed[1] > passed[0], passed  # the preference rose (the demo's exit said so too)
    return passed, correct


def test_after_a_demo_round_the_dashboard_leads_with_what_changed(tmp_path: Path) -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import expect, sync_playwright

    state = tmp_path / "demo"
    passed, correct = _demo_round(state)
    serve = ReefServer(state, "-c", str(state / "serve.yaml"), "--model", "smollm2")
    with serve as reef, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(30_000)
            # the overview's learning cell: the held-out pass rate, base → new release
            page.goto(f"{reef.url}/ui")
            row = page.get_by_role("row").filter(has_text=SCENARIO)
            rise = row.locator(".lead").filter(has_text="held-out pass rate")
            expect(rise).to_contain_text(f"{num(passed[0])} → {num(passed[1])} #0→#1")
            drift = row.locator(".lead").filter(has_text="held-out answers correct")
            expect(drift).to_contain_text(f"{num(correct[0])} → {num(correct[1])} #0→#1")
            _shot(page, "demo-overview")
            # the learning page leads with both changes, and draws them in its main chart
            page.goto(f"{reef.url}/ui/s/{SCENARIO}/curves")
            changes = page.locator("ul.changes li")
            rise = changes.filter(has_text="held-out pass rate")
            expect(rise).to_contain_text(f"{num(passed[0])} at #0 → {num(passed[1])} at #1")
            expect(rise.locator(".delta.up")).to_be_visible()
            drift = changes.filter(has_text="held-out answers correct")
            expect(drift).to_contain_text(f"{num(correct[0])} at #0 → {num(correct[1])} at #1")
            if correct[1] < correct[0]:
                expect(drift.locator(".delta.down")).to_be_visible()
            legend = page.locator("#curve .u-legend")
            expect(legend).to_contain_text("held-out pass rate")
            expect(legend).to_contain_text("held-out answers correct")
            _shot(page, "demo-learning")
        finally:
            browser.close()
