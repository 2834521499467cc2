"""`reef.select.tags`: one role of a multi-agent app learns from its own turns. Two roles call
one scenario (the official openai SDK, `x-reef-tag-role` headers), every call is reported; the
status route counts the planner's slice, and `reef evolve` trains on it alone."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml

from reef.cli.main import main
from reef.cli.testing import InProcessReef
from reef.store.sql import open_store
from reef.testing.traffic import traffic


@pytest.mark.loop  # trains and publishes a release (~25 s): the loop stage, not `make test`
def test_a_role_learns_from_its_own_turns_only(
    tmp_path: Path, prefect_server: None, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "cfg.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "reef": {
                    "recipe": "sft",
                    "batch_size": 3,
                    "params": {"epochs": 1},
                    "select": {"tags": {"role": "planner"}},
                },
                "gate": {"policy": "always"},
            }
        )
    )
    with InProcessReef(tmp_path / "state", config=config) as srv:

        def calls(role: str, n: int) -> list[str]:
            return traffic(
                srv,
                "team",
                n,
                prompt=role + " step {i}",
                report=lambda i, rid: {"score": 1.0},
                max_tokens=3,
                extra_headers={"x-reef-tag-role": role},
            )

        executor = calls("executor", 4)
        planner = calls("planner", 3)
        status = httpx.get(f"{srv.url}/reef/scenarios/team/status").json()
        assert (status["eligible"], status["ready"]) == (3, True), status
        assert status["dropped"]["not_selected"] == 4, status

        common = ["-c", str(config), "--state-dir", str(srv.state_dir), "--model", "tiny"]
        common += ["--port", str(srv.port), "--scenario", "team"]
        assert main(["evolve", *common, "--force"]) == 0  # in process (no deployment here)
        out = capsys.readouterr().out  # Prefect's log lines, then the result as JSON
        assert json.loads(out[out.rindex('{\n  "status"') :])["status"] == "published"

        store = open_store(srv.settings.database_url)
        try:
            trained = store.consumed_record_ids("team", "sft")
        finally:
            store.close()
        assert trained == set(planner) and not trained & set(executor)
        after = httpx.get(f"{srv.url}/reef/scenarios/team/status").json()
        assert (after["eligible"], after["dropped"]["not_selected"]) == (0, 4), after
