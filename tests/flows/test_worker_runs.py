"""The evolve worker never stalls: while one scenario's candidate waits for approval (the manual
gate pauses its flow run), another scenario evolves to its own candidate, and a user's
instruction job completes. Driven through a real `reef serve` with its worker process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from reef.testing.process import ReefServer
from reef.testing.traffic import traffic
from tests.reefserver import wait_for


def _pending(srv: ReefServer, scenario: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{srv.url}/reef/scenarios/{scenario}/candidates", params={"status": "pending"})
    return r.json()["data"] if r.status_code == 200 else []


@pytest.mark.loop
def test_a_waiting_candidate_holds_up_no_other_run(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "reef": {"recipe": "sft", "batch_size": 2, "params": {"epochs": 1}},
                # both reports train: with none held out, 2 reports always make a batch
                "gate": {"policy": "manual", "approval_timeout_s": 600, "holdout": 0.0},
            }
        )
    )
    env = {"REEF_REEF__AUTO": "true"}
    with ReefServer(tmp_path / "state", "-c", str(cfg), "--model", "tiny", env=env) as srv:

        def good(i: int, rid: str) -> dict[str, Any]:
            return {"score": 1.0, "feedback": {"correction": "yes"}}

        traffic(srv, "waits", 2, report=good, max_tokens=3)
        first = wait_for("the first candidate pending", lambda: _pending(srv, "waits"), srv)

        # the first flow run is paused for approval; the worker still runs everything else
        traffic(srv, "moves-on", 2, report=good, max_tokens=3)
        r = httpx.post(
            f"{srv.url}/reef/train",
            json={"text": "Answer in one word."},
            headers={"x-reef-scenario": "waits"},
        )
        assert r.status_code == 202, r.text
        job_url = r.json()["url"]
        wait_for("the other scenario's candidate", lambda: _pending(srv, "moves-on"), srv)
        job = wait_for(
            "the instruction job done",
            lambda: (j := httpx.get(job_url).json())["status"] in ("done", "failed") and j,
            srv,
        )
        assert job["status"] == "done", job
        # the first candidate still waits, untouched, until someone decides
        assert [c["release_id"] for c in _pending(srv, "waits") if c["recipe"] == "sft"] == [
            first[0]["release_id"]
        ]
        r = httpx.post(
            f"{srv.url}/reef/scenarios/waits/promote",
            json={"release_id": first[0]["release_id"]},
            timeout=120,
        )
        assert r.status_code == 201, r.text
        assert r.json()["metadata"]["approval"]["via"] == "reef"
