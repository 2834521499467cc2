"""Full weights: `reef.params: {full: true}` trains every weight; the release is a checkpoint,
swapped into the serving engine without a restart, and rollback returns to the adapter-free
base just the same."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import openai

from reef.cli.testing import InProcessReef
from reef.testing.traffic import traffic


def test_a_full_checkpoint_release_serves_and_rolls_back(
    tmp_path: Path, prefect_server: None
) -> None:
    from reef.flows.evolve import evolve

    with InProcessReef(tmp_path / "state") as srv:
        traffic(srv, "full", 2, report=lambda i, rid: {"score": 1.0}, max_tokens=3)
        client = openai.OpenAI(
            base_url=srv.base_url, api_key="none", default_headers={"x-reef-scenario": "full"}
        )
        overrides = {
            "server": {"state_dir": str(srv.state_dir), "port": srv.port},
            "engine": {"model": "tiny"},
            "reef": {
                "recipe": "sft",
                "batch_size": 2,
                "params": {"epochs": 2, "full": True, "learning_rate": 0.01},
            },
            "gate": {"policy": "always"},
        }
        result = evolve("full", overrides=overrides)
        assert result["status"] == "published", result
        chain = httpx.get(f"{srv.url}/reef/scenarios/full/releases").json()["data"]
        assert chain[0]["kind"] == "checkpoint" and chain[0]["current"]
        # the flow run that made it, for the dashboard's link to Prefect
        assert uuid.UUID(chain[0]["metadata"]["flow_run_id"])
        question = [{"role": "user", "content": "q7"}]
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=question, max_tokens=6, temperature=0
        )
        assert raw.headers["x-reef-release-id"] == result["release_id"]
        trained_answer = raw.parse().choices[0].message.content

        r = httpx.post(
            f"{srv.url}/reef/scenarios/full/rollback",
            json={"release_id": chain[1]["release_id"]},
            timeout=120,
        )
        assert r.status_code == 201, r.text
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=question, max_tokens=6, temperature=0
        )
        assert raw.headers["x-reef-release-id"] == r.json()["release_id"]
        base_answer = raw.parse().choices[0].message.content
        assert base_answer != trained_answer  # the checkpoint was really serving
