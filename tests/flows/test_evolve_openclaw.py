"""The openclaw recipe end to end on the tiny model: sessions whose next turns a rule judge
scores (the worker's judging pass), then the evolve flow trains, gates, publishes and deploys
a LoRA release from those judgments alone, as every recipe does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from reef.cli.testing import InProcessReef
from reef.flows.judging import Judging
from reef.settings import JudgeSettings
from reef.store.sql import open_store

SCENARIO = "openclaw"
CONFIG = """
reef:
  recipe: openclaw
  batch_size: 4
  params: {batch_size: 2}
gate: {policy: always, holdout: 0.0}
judge: {function: "tests.judge.test_judging:rule_judge"}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    with InProcessReef(tmp_path_factory.mktemp("openclaw")) as srv:
        yield srv


def _session(client: openai.OpenAI, question: str, reaction: str) -> str:
    first = [{"role": "user", "content": question}]
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=first, max_tokens=6, temperature=0.6, seed=len(question)
    )
    answer = raw.parse().choices[0].message.content or ""
    client.chat.completions.create(
        model="tiny",
        messages=[
            *first,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": reaction},
        ],
        max_tokens=2,
    )
    return raw.headers["x-reef-agent-record-id"]


@pytest.mark.loop
def test_openclaw_learns_from_judged_reactions(
    server: InProcessReef, tmp_path: Path, prefect_server: None
) -> None:
    from reef.flows.evolve import evolve

    client = openai.OpenAI(
        base_url=server.base_url, api_key="x", default_headers={"x-reef-scenario": SCENARIO}
    )
    judged = [
        _session(
            client, f"Question {i}?", "Too long. Keep it to one sentence." if i % 2 else "Thanks!"
        )
        for i in range(4)
    ]
    record = httpx.get(f"{server.url}/reef/scenarios/{SCENARIO}/records/{judged[0]}").json()
    assert record["completion_token_ids"]

    settings = server.settings.model_copy(
        update={"judge": JudgeSettings(function="tests.judge.test_judging:rule_judge")}
    )
    store = open_store(settings.database_url)
    judging = Judging(settings, store)
    try:
        judging.run_pass([SCENARIO])
        assert judging.counts["judged"] == 4
        stored = store.get_record(SCENARIO, judged[0])
        assert stored.topk is not None and len(stored.topk["ids"]) == len(
            stored.completion_token_ids or []
        )
    finally:
        judging.close()
        store.close()

    config = tmp_path / "openclaw.yaml"
    config.write_text(CONFIG)
    overrides = {
        "server": {"state_dir": str(server.state_dir), "port": server.port},
        "engine": {"model": "tiny"},
    }
    result = evolve(SCENARIO, config=str(config), overrides=overrides)
    assert result["status"] == "published", result
    assert result["dataset"]["rows"] == 4 and result["dataset"]["kind"] == "rollout"
    chain = httpx.get(f"{server.url}/reef/scenarios/{SCENARIO}/releases").json()["data"]
    head = chain[0]
    assert head["release_id"] == result["release_id"]
    assert head["recipe"] == "openclaw" and head["kind"] == "adapter"
    metrics = head["metrics"]
    assert metrics["train_rows_used"] == 4 and metrics["train_steps"] == 2
    assert metrics["train_rows_hinted"] == 2  # the two complaints brought hints
    assert "train_opd_loss" in metrics and "train_rl_loss" in metrics
    # Deployed: the scenario now answers from the new head.
    after = client.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "Question 9?"}], max_tokens=2
    )
    rid = after.headers["x-reef-agent-record-id"]
    served = httpx.get(f"{server.url}/reef/scenarios/{SCENARIO}/records/{rid}").json()
    assert served["release_id"] == result["release_id"]


@pytest.mark.loop
@pytest.mark.timeout(900)
def test_the_worker_judges_and_evolves_on_its_own(tmp_path: Path) -> None:
    """A real `reef serve` with its worker: nobody reports; the worker's judge reads each next
    turn, and once 4 turns are judged the worker evolves and deploys an openclaw release."""
    import yaml

    from reef.testing.process import ReefServer
    from tests.reefserver import wait_for

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "reef": {"recipe": "openclaw", "batch_size": 4, "params": {"batch_size": 4}},
                "gate": {"policy": "always", "holdout": 0.0},
                "judge": {"function": "tests.judge.test_judging:rule_judge", "poll_s": 0.5},
            }
        )
    )
    env = {"REEF_REEF__AUTO": "true"}
    with ReefServer(tmp_path / "state", "-c", str(cfg), "--model", "tiny", env=env) as srv:
        client = openai.OpenAI(
            base_url=f"{srv.url}/v1", api_key="x", default_headers={"x-reef-scenario": "auto"}
        )
        for i in range(4):
            _session(client, f"Question {i}?", "Too long. Keep it to one sentence.")

        def published() -> list[dict[str, object]]:
            r = httpx.get(f"{srv.url}/reef/scenarios/auto/releases")
            rows = r.json()["data"] if r.status_code == 200 else []
            return [c for c in rows if c["recipe"] == "openclaw"]

        (release,) = wait_for("an openclaw release", published, srv, timeout=600)
        assert release["metrics"]["train_rows_hinted"] == 4
        reports = httpx.get(f"{srv.url}/reef/scenarios/auto/reports").json()["data"]
        assert len(reports) == 4 and all(r["metadata"]["source"] == "judge" for r in reports)
