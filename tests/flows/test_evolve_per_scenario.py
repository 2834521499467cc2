"""scenarios.<name>: two scenarios in one `reef serve`, each learning with its own recipe,
batch size and gate. The status route counts each against its own batch, and an evolve run
of each trains and publishes with its own recipe."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml

from reef.cli.main import main
from reef.cli.testing import InProcessReef
from reef.testing.traffic import traffic


@pytest.mark.loop  # trains and publishes two releases (~40 s): the loop stage
def test_two_scenarios_learn_each_with_its_own_recipe(
    tmp_path: Path, prefect_server: None, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "cfg.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "reef": {"recipe": "sft", "batch_size": 3, "params": {"epochs": 1}},
                "gate": {"policy": "always"},
                "scenarios": {"tone": {"reef": {"recipe": "kto", "batch_size": 4}}},
            }
        )
    )
    with InProcessReef(tmp_path / "state", config=config) as srv:
        for scenario, n in (("support", 3), ("tone", 4)):
            traffic(
                srv,
                scenario,
                n,
                report=lambda i, rid: {"score": float(i % 2)},
                max_tokens=3,
            )
        for scenario, recipe, batch in (("support", "sft", 3), ("tone", "kto", 4)):
            status = httpx.get(f"{srv.url}/reef/scenarios/{scenario}/status").json()
            assert (status["recipe"], status["batch_size"], status["ready"]) == (
                recipe,
                batch,
                True,
            ), status

        common = ["-c", str(config), "--state-dir", str(srv.state_dir), "--model", "tiny"]
        for scenario, recipe in (("support", "sft"), ("tone", "kto")):
            args = [*common, "--port", str(srv.port), "--scenario", scenario, "--force"]
            assert main(["evolve", *args]) == 0
            out = capsys.readouterr().out
            result = json.loads(out[out.rindex('{\n  "status"') :])
            assert result["status"] == "published", result
            releases = httpx.get(f"{srv.url}/reef/scenarios/{scenario}/releases").json()["data"]
            head = next(r for r in releases if r["current"])
            assert head["release_id"] == result["release_id"] and head["recipe"] == recipe, head
