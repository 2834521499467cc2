"""The seed's configuration runs as written: SAO (recipes.sao.recipe:SAORecipe), one scored
rollout per step, max_staleness 18, through the evolve flow against a served Reef app."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from reef.cli.testing import InProcessReef
from reef.testing.traffic import traffic

SEED = """
reef:
  recipe: recipes.sao.recipe:SAORecipe
  batch_size: 1
  max_staleness: 18
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    with InProcessReef(tmp_path_factory.mktemp("sao")) as srv:
        yield srv


def test_seed_config_evolves_one_rollout_at_a_time(
    server: InProcessReef, tmp_path: Path, prefect_server: None
) -> None:
    from reef.flows.evolve import evolve

    config = tmp_path / "seed.yaml"
    config.write_text(SEED + "gate: {policy: always}\n")
    assert yaml.safe_load(SEED)["reef"]["batch_size"] == 1
    overrides = {
        "server": {"state_dir": str(server.state_dir), "port": server.port},
        "engine": {"model": "tiny"},
    }
    heads = []
    for step in range(2):
        score = 1.0 if step == 0 else -1.0
        (rid,) = traffic(
            server,
            "sao",
            1,
            prompt=f"What is {step} + 2?",
            report=lambda i, rid, score=score: {"score": score},
            max_tokens=6,
            temperature=1.0,
            seed=step,
        )
        record = httpx.get(f"{server.url}/reef/scenarios/sao/records/{rid}").json()
        assert record["completion_token_ids"] and record["logprobs"]  # what SAO trains on
        result = evolve("sao", config=str(config), overrides=overrides)
        assert result["status"] == "published", result
        assert result["dataset"]["rows"] == 1 and result["dataset"]["kind"] == "rollout"
        heads.append(result["release_id"])
    chain = httpx.get(f"{server.url}/reef/scenarios/sao/releases").json()["data"]
    assert [c["release_id"] for c in chain[:2]] == heads[::-1]
    assert chain[0]["parent_release_id"] == heads[0]  # the second step built on the first
    assert chain[0]["recipe"] == "sao" and chain[0]["kind"] == "adapter"
    assert "train_clipfrac" in chain[0]["metrics"]
