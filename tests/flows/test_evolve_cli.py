"""`reef evolve --scenario S`: evolve by hand, from the command line, against a running server."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml

from reef.cli.main import main
from reef.cli.testing import InProcessReef
from reef.testing.traffic import traffic


def test_reef_evolve_by_hand(
    tmp_path: Path, prefect_server: None, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "cfg.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "reef": {"recipe": "sft", "batch_size": 8, "params": {"epochs": 1}},
                "gate": {"policy": "always"},
            }
        )
    )
    with InProcessReef(tmp_path / "state", config=config) as srv:
        traffic(srv, "cli", 1, prompt="q", report=lambda i, rid: {"score": 1.0}, max_tokens=3)
        common = ["-c", str(config), "--state-dir", str(srv.state_dir), "--model", "tiny"]
        common += ["--port", str(srv.port), "--scenario", "cli"]
        # 1 eligible sample of 8: --force trains on what there is
        assert main(["evolve", *common, "--force"]) == 0
        out = capsys.readouterr().out  # Prefect's log lines, then the result as JSON
        result = json.loads(out[out.rindex('{\n  "status"') :])
        assert result["status"] == "published"
        head = httpx.get(f"{srv.url}/reef/scenarios/cli").json()["head_release_id"]
        assert head == result["release_id"]
