"""The evolve flow deploys exactly once: the engine's verify step fails on the first attempt,
the deploy task's retry publishes the candidate, and the batch is consumed once, by that
candidate."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from reef.cli.testing import InProcessReef
from reef.errors import EngineUnavailable
from reef.store.sql import open_store
from reef.testing.traffic import traffic
from reef.variants import Variants

S = "exactly-once"


@pytest.mark.loop
def test_a_verify_that_fails_once_still_publishes_once(
    tmp_path: Path, prefect_server: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from reef.flows import release as release_flow
    from reef.flows.evolve import evolve

    calls = {"n": 0}
    real = Variants.verify

    async def verify(self: Variants, name: str) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise EngineUnavailable("the engine was busy")
        return await real(self, name)

    monkeypatch.setattr(Variants, "verify", verify)
    monkeypatch.setattr(release_flow, "DEPLOY_ATTEMPTS", 3)
    with InProcessReef(tmp_path / "state") as srv:
        traffic(srv, S, 2, report=lambda i, rid: {"score": 1.0}, max_tokens=3)
        overrides = {
            "server": {"state_dir": str(srv.state_dir), "port": srv.port},
            "engine": {"model": "tiny"},
            "reef": {"recipe": "sft", "batch_size": 2, "params": {"epochs": 1}},
            "gate": {"policy": "always"},
        }
        result = evolve(S, overrides=overrides)
        assert result["status"] == "published", result
        assert calls["n"] == 2  # failed once, then verified
        store = open_store(srv.settings.database_url)
        try:
            chain = store.list_releases(S)
            assert [r.id for r in chain][1:] == [result["candidate_id"]]
            assert store.get_candidate(S, result["candidate_id"]).status == "published"
        finally:
            store.close()
        with sqlite3.connect(srv.state_dir / "reef.db") as db:
            batches = db.execute(
                "SELECT batch_id, COUNT(*) FROM consumptions WHERE scenario = ? GROUP BY batch_id",
                (S,),
            ).fetchall()
        assert batches == [(result["candidate_id"], 2)]
