"""The whole loop through a real `reef serve`: calls and reports with the official openai SDK,
the evolve worker trains (SFT, tiny model), the gate passes, the release is deployed without a
restart and serves the next call; rollback makes the base the head again."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from reef.testing.process import ReefServer
from reef.testing.traffic import report_all, traffic
from tests.reefserver import wait_for

S = "e2e"


@pytest.mark.loop
def test_sft_release_deploys_serves_and_rolls_back(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "reef": {"recipe": "sft", "batch_size": 4, "params": {"epochs": 2}},
                "gate": {"policy": "always"},
            }
        )
    )
    state = tmp_path / "state"
    with ReefServer(
        state, "-c", str(cfg), "--model", "tiny", env={"REEF_REEF__AUTO": "true"}
    ) as srv:
        client = openai.OpenAI(
            base_url=srv.base_url, api_key="none", default_headers={"x-reef-scenario": S}
        )
        releases = lambda: httpx.get(f"{srv.url}/reef/scenarios/{S}/releases").json()["data"]  # noqa: E731
        receipts = traffic(srv, S, 4, prompt="question {i}", max_tokens=4, temperature=0)
        base = releases()
        assert len(base) == 1 and base[0]["current"]
        report_all(
            srv,
            S,
            receipts,
            lambda i, rid: {"score": 1.0, "feedback": {"correction": "yes indeed"}},
        )

        def two_releases() -> list[dict] | None:
            chain = releases()
            return chain if len(chain) == 2 else None

        chain = wait_for("a new release", two_releases, srv, 240)
        new = chain[0]
        assert new["current"] and new["operation"] == "training" and new["kind"] == "adapter"
        assert new["parent_release_id"] == base[0]["release_id"]
        assert new["model_uri"].startswith("models:/reef-e2e/")

        # the next call is served by the new release and its record says so
        time.sleep(2.5)  # past the scenario cache TTL (the deploy also refreshes it)
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": "question 9"}], max_tokens=4
        )
        assert raw.headers["x-reef-release-id"] == new["release_id"]
        rec = httpx.get(
            f"{srv.url}/reef/scenarios/{S}/records/{raw.headers['x-reef-agent-record-id']}"
        ).json()
        assert rec["release_id"] == new["release_id"]

        # its model_uri loads in MLflow (mlflow.pyfunc) and generates
        from reef import registry

        tracking = f"sqlite:///{(state / 'mlflow.db').resolve()}"
        model = registry.load(tracking, new["model_uri"])
        answers = model.predict(
            [[{"role": "user", "content": "question 0"}]], params={"max_new_tokens": 3}
        )
        assert len(answers) == 1 and isinstance(answers[0], str)

        # rollback to the first release: a new head with the base's content, serving now
        r = httpx.post(
            f"{srv.url}/reef/scenarios/{S}/rollback",
            json={"release_id": base[0]["release_id"]},
            timeout=120,
        )
        assert r.status_code == 201, r.text
        rolled = r.json()
        assert rolled["operation"] == "rollback" and rolled["kind"] == "base"
        chain = releases()
        assert chain[0]["release_id"] == rolled["release_id"] and chain[0]["current"]
        assert [c["seq"] for c in chain] == [2, 1, 0]
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=[{"role": "user", "content": "question 10"}], max_tokens=4
        )
        assert raw.headers["x-reef-release-id"] == rolled["release_id"]
        # the MLflow alias follows the head
        champ = registry.champion(tracking, S)
        assert champ is not None and champ[1] == rolled["release_id"]
