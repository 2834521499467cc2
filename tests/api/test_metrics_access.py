"""/metrics behind `server.metrics_token` (Bearer), and scenario names on /metrics only when
allowed: with a token by default, or `server.metrics_scenario_labels: true`; otherwise the
counters and readiness gauges are totals with no scenario label."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx

from reef.cli.testing import InProcessReef

TOKEN = "metrics-" + uuid.uuid4().hex


def _traffic(server: InProcessReef, scenario: str) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = httpx.post(
        f"{server.base_url}/chat/completions", json=body, headers={"x-reef-scenario": scenario}
    )
    r.raise_for_status()
    receipt = r.headers["x-reef-agent-record-id"]
    r = httpx.post(
        f"{server.url}/reef/report",
        json={"score": 1.0, "references": [receipt]},
        headers={"x-reef-scenario": scenario},
    )
    r.raise_for_status()


def _scrape_until(server: InProcessReef, line: str, **kwargs: object) -> str:
    """/metrics once `line` shows (readiness is computed in the background)."""
    deadline, text = time.monotonic() + 30, ""
    while line not in text and time.monotonic() < deadline:
        r = httpx.get(f"{server.url}/metrics", **kwargs)  # type: ignore[arg-type]
        assert r.status_code == 200, r.text
        text = r.text
        time.sleep(0.2)
    assert line in text, text[-3000:]
    return text


def test_metrics_token_required_and_scenarios_named(tmp_path: Path) -> None:
    config = tmp_path / "serve.yaml"
    # every report counts toward the batch: none is held out for the gate
    config.write_text(
        f"server:\n  metrics_token: {TOKEN}\nreef:\n  batch_size: 1\ngate:\n  holdout: 0.0\n"
    )
    scenario = f"m-{uuid.uuid4().hex[:8]}"
    with InProcessReef(tmp_path / "state", config=config) as server:
        _traffic(server, scenario)
        url = f"{server.url}/metrics"
        for headers in ({}, {"authorization": "Bearer nope"}, {"x-api-key": TOKEN}):
            r = httpx.get(url, headers=headers)
            assert r.status_code == 401, (headers, r.text)
            assert r.json()["error"]["type"] == "authentication_error"
            assert scenario not in r.text
        text = _scrape_until(
            server,
            f'reef_experience_ready{{kind="scored",scenario="{scenario}"}} 1.0',
            headers={"authorization": f"Bearer {TOKEN}"},
        )
        assert f'reef_reports_total{{scenario="{scenario}"}} 1.0' in text
        assert TOKEN not in server.log()


def test_open_metrics_name_no_scenario(tmp_path: Path) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text("reef:\n  batch_size: 1\ngate:\n  holdout: 0.0\n")
    scenarios = [f"m-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    with InProcessReef(tmp_path / "state", config=config) as server:
        for scenario in scenarios:
            _traffic(server, scenario)
        text = _scrape_until(server, 'reef_experience_ready{kind="scored"} 2.0')
        assert 'reef_experience_eligible{kind="scored"} 2.0' in text
        assert 'reef_experience_awaiting_feedback{kind="scored"} 0.0' in text
        assert 'reef_records_written_total{route="chat.completions"} 2.0' in text
        assert "reef_reports_total 2.0" in text
        assert 'reef_tokens_total{kind="completion"}' in text
        assert not any(s in text for s in scenarios)
        assert "scenario=" not in text
