"""GET /reef/scenarios/{s}/status and the readiness gauges, through a served Reef app."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reef.cli.testing import InProcessReef


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    state = tmp_path_factory.mktemp("reef-status")
    config = state / "serve.yaml"
    config.write_text(
        "server:\n  metrics_scenario_labels: true\n"
        "engine:\n  default_max_tokens: 4\nreef:\n  batch_size: 2\n"
        # sampled answers decide which samples the gate holds out: none here, so the counts
        # are the same in every run (tests/experience/test_readiness.py covers the pool)
        "gate:\n  holdout: 0.0\n"
    )
    with InProcessReef(state, config=config) as srv:
        yield srv


def _chat(server: InProcessReef, scenario: str, text: str) -> str:
    r = httpx.post(
        f"{server.base_url}/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": text}]},
        headers={"x-reef-scenario": scenario},
        timeout=60,
    )
    r.raise_for_status()
    return r.headers["x-reef-agent-record-id"]


def _state(server: InProcessReef, scenario: str) -> tuple[int, int]:
    recs = httpx.get(f"{server.url}/reef/scenarios/{scenario}/records", params={"limit": 1000})
    reps = httpx.get(f"{server.url}/reef/scenarios/{scenario}/reports", params={"limit": 1000})
    return len(recs.json()["data"]), len(reps.json()["data"])


def test_status_counts_without_side_effects(server: InProcessReef) -> None:
    scenario = f"st-{uuid.uuid4().hex[:8]}"
    receipts = [_chat(server, scenario, "Name a color.") for _ in range(3)]
    url = f"{server.url}/reef/scenarios/{scenario}/status"

    first = httpx.get(url)
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["eligible"] == 0 and body["ready"] is False and body["batch_size"] == 2
    assert (body["awaiting_feedback"], body["kind"], body["recipe"]) == (3, "scored", "sft")

    for rid, score in zip(receipts[:2], (1.0, 0.0), strict=True):
        r = httpx.post(
            f"{server.url}/reef/report",
            json={"score": score, "references": [rid]},
            headers={"x-reef-scenario": scenario},
        )
        assert r.status_code == 201, r.text
    r = httpx.post(
        f"{server.url}/reef/report",
        json={"feedback": "no score here", "references": [receipts[2]]},
        headers={"x-reef-scenario": scenario},
    )
    assert r.status_code == 201, r.text

    before = _state(server, scenario)
    body = httpx.get(url).json()
    assert (body["eligible"], body["ready"], body["awaiting_feedback"]) == (2, True, 0)
    assert body["waiting"] is None
    assert body["dropped"] == {"no_score": 1} and body["last_materialization"] is None
    assert httpx.get(url).json() == body
    assert _state(server, scenario) == before == (3, 3)
    assert not (Path(server.state_dir) / "artifacts").exists()

    pref = httpx.get(url, params={"kind": "preference"}).json()
    assert (pref["kind"], pref["eligible"]) == ("preference", 1)
    assert httpx.get(url, params={"kind": "bogus"}).status_code == 400
    assert httpx.get(f"{server.url}/reef/scenarios/st-missing/status").status_code == 404

    # the same numbers in /metrics (computed in the background: poll)
    line = f'reef_experience_eligible{{kind="scored",scenario="{scenario}"}} 2.0'
    deadline = time.monotonic() + 30
    text = ""
    while time.monotonic() < deadline:
        text = httpx.get(f"{server.url}/metrics").text
        if line in text:
            break
        time.sleep(0.5)
    assert line in text
    assert f'reef_experience_ready{{kind="scored",scenario="{scenario}"}} 1.0' in text
    dropped = (
        f'reef_experience_dropped{{kind="scored",reason="no_score",scenario="{scenario}"}} 1.0'
    )
    assert dropped in text
