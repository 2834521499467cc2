"""Back up a deployment that has learned, restore it into a fresh state directory, and it
serves the same head with the same greedy answers, holds its records and reports, and learns
on: the next reports lead to the next release, trained on top of the restored head. A real
`reef serve` with its evolve worker (tiny model, SFT) on each side; `reef backup` runs while
the first one serves, and the first one's directory is deleted before the restore's server
starts (it can need nothing from it)."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from reef.testing.process import REEF, ReefServer
from reef.testing.traffic import report_all, traffic
from tests.reefserver import wait_for

S = "kept"
PROMPTS = ["question 0", "question 7", "what is new"]
AUTO = {"REEF_REEF__AUTO": "true"}


def _chain(srv: ReefServer) -> list[dict[str, Any]]:
    return httpx.get(f"{srv.url}/reef/scenarios/{S}/releases").json()["data"]


def _chain_of(srv: ReefServer, n: int) -> list[dict[str, Any]] | None:
    chain = _chain(srv)
    return chain if len(chain) == n else None


def _answers(srv: ReefServer) -> tuple[list[str], set[str]]:
    """Greedy answers to PROMPTS, and the releases that served them."""
    client = openai.OpenAI(
        base_url=srv.base_url, api_key="none", default_headers={"x-reef-scenario": S}
    )
    answers, served = [], set()
    for prompt in PROMPTS:
        raw = client.chat.completions.with_raw_response.create(
            model="tiny",
            messages=[{"role": "user", "content": prompt}],
            max_tokens=8,
            temperature=0,
        )
        answers.append(raw.parse().choices[0].message.content or "")
        served.add(raw.headers["x-reef-release-id"])
    return answers, served


def _count(srv: ReefServer, what: str) -> int:
    return len(
        httpx.get(f"{srv.url}/reef/scenarios/{S}/{what}", params={"limit": 1000}).json()["data"]
    )


def _reef(*args: str) -> str:
    done = subprocess.run([REEF, *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _good(i: int, rid: str) -> dict[str, Any]:
    return {"score": 1.0, "feedback": {"correction": "yes indeed"}}


@pytest.mark.loop
@pytest.mark.timeout(900)  # two servers, two trainings: 2.5 min at load 5, 5 min at load 12
def test_a_restored_deployment_serves_the_same_head_and_learns_on(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "reef": {"recipe": "sft", "batch_size": 4, "params": {"epochs": 2}},
                "gate": {"policy": "always"},
            }
        )
    )
    old, new, saved = tmp_path / "old", tmp_path / "new", tmp_path / "backup"
    with ReefServer(old, "-c", str(cfg), "--model", "tiny", env=AUTO) as srv:
        report_all(srv, S, traffic(srv, S, 4, prompt="question {i}", max_tokens=4), _good)
        chain = wait_for("a release", lambda: _chain_of(srv, 2), srv, 240)
        time.sleep(2.5)  # past the scenario cache's TTL
        answers, served = _answers(srv)
        assert served == {chain[0]["release_id"]}
        records, reports = _count(srv, "records"), _count(srv, "reports")
        out = _reef("backup", "--state-dir", str(old), "--output", str(saved))  # while serving
        assert "artifacts" in out and "MLflow" in out
    shutil.rmtree(old)

    out = _reef("restore", "--state-dir", str(new), "--input", str(saved))
    assert "1 scenarios at the backup's heads" in out
    with ReefServer(new, "-c", str(cfg), "--model", "tiny", env=AUTO) as srv:
        assert [r["release_id"] for r in _chain(srv)] == [r["release_id"] for r in chain]
        assert _answers(srv) == (answers, served)  # the same head, the same greedy answers
        assert (_count(srv, "records"), _count(srv, "reports")) == (records + 3, reports)

        # Learning goes on from where it was: new reports, the next release on the head.
        report_all(srv, S, traffic(srv, S, 4, prompt="again {i}", max_tokens=4), _good)
        longer = wait_for("the next release", lambda: _chain_of(srv, 3), srv, 240)
        assert longer[0]["parent_release_id"] == chain[0]["release_id"]
        assert longer[0]["operation"] == "training"
