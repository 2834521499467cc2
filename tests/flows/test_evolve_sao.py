"""The seed's configuration runs as written: SAO (recipes.sao.recipe:SAORecipe), one scored
rollout per step, max_staleness 18, through the evolve flow against a real `reef serve`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from tests.reefserver import ReefServer

SEED = """
reef:
  recipe: recipes.sao.recipe:SAORecipe
  batch_size: 1
  max_staleness: 18
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReefServer]:
    with ReefServer(tmp_path_factory.mktemp("sao"), "--model", "tiny") as srv:
        yield srv


def test_seed_config_evolves_one_rollout_at_a_time(
    server: ReefServer, tmp_path: Path, prefect_server: None
) -> None:
    from flows.evolve import evolve

    config = tmp_path / "seed.yaml"
    config.write_text(SEED + "gate: {policy: always}\n")
    assert yaml.safe_load(SEED)["reef"]["batch_size"] == 1
    overrides = {
        "server": {"state_dir": str(server.state_dir), "port": server.port},
        "engine": {"model": "tiny"},
    }
    client = openai.OpenAI(
        base_url=server.base_url, api_key="none", default_headers={"x-reef-scenario": "sao"}
    )
    heads = []
    for step in range(2):
        raw = client.chat.completions.with_raw_response.create(
            model="tiny",
            messages=[{"role": "user", "content": f"What is {step} + 2?"}],
            max_tokens=6,
            temperature=1.0,
            seed=step,
        )
        rid = raw.headers["x-reef-agent-record-id"]
        record = httpx.get(f"{server.url}/reef/scenarios/sao/records/{rid}").json()
        assert record["completion_token_ids"] and record["logprobs"]  # what SAO trains on
        r = httpx.post(
            f"{server.url}/reef/report",
            json={"references": [rid], "score": 1.0 if step == 0 else -1.0},
            headers={"x-reef-scenario": "sao"},
        )
        assert r.status_code == 201
        result = evolve("sao", config=str(config), overrides=overrides)
        assert result["status"] == "published", result
        assert result["dataset"]["rows"] == 1 and result["dataset"]["kind"] == "rollout"
        heads.append(result["release_id"])
    chain = httpx.get(f"{server.url}/reef/scenarios/sao/releases").json()["data"]
    assert [c["release_id"] for c in chain[:2]] == heads[::-1]
    assert chain[0]["parent_release_id"] == heads[0]  # the second step built on the first
    assert chain[0]["recipe"] == "sao" and chain[0]["kind"] == "adapter"
    assert "train_clipfrac" in chain[0]["metrics"]
