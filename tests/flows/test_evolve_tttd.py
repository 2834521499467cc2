"""The tttd recipe through the evolve flow against a served Reef: rollouts asked over HTTP,
reported with step-grid metadata; an incomplete grid waits and consumes nothing, a changed
retry at a slot is a 409 and a second receipt at a filled slot is ignored; the full grid
trains one step under the recipe's default `always` gate and its release serves next."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from demo.discover.harness import Config, Reef
from demo.discover.packing import prompt
from reef.cli.testing import InProcessReef
from reef.recipes.tttd.grid import grid_metadata

G, R = 2, 3


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    with InProcessReef(tmp_path_factory.mktemp("tttd")) as srv:
        yield srv


@pytest.mark.loop
@pytest.mark.timeout(900)  # four evolve runs on a shared 2-core machine
def test_the_grid_barrier_through_the_evolve_flow(
    server: InProcessReef, tmp_path: Path, prefect_server: None
) -> None:
    from reef.flows.evolve import evolve

    overrides = {
        "server": {"state_dir": str(server.state_dir), "port": server.port},
        "engine": {"model": "tiny"},
        "reef": {
            "recipe": "tttd",
            "batch_size": G * R,
            "max_staleness": 0,
            "params": {"groups_per_step": G, "rollouts_per_group": R, "lora_r": 4},
        },
    }
    reef = Reef(server.url, "tttd", "tiny")
    cfg = Config(n=2, groups=G, rollouts=R, max_tokens=8)
    try:
        answers = {
            (g, r): reef.chat(prompt(2, None, 0.0, ""), cfg) for g in range(G) for r in range(R)
        }
        (base,) = {release for _, _, release in answers.values()}

        def send(g: int, r: int, receipt: str, score: float) -> int:
            meta = grid_metadata(0, g, r, G, R)
            return reef.report(receipt, score, "judged", meta, f"tttd-t-0-{g}-{r}")

        slots = sorted(answers)
        for g, r in slots[:-1]:
            assert send(g, r, answers[g, r][1], 0.5 * r + g) == 201
        waiting = evolve("tttd", overrides=overrides)
        assert waiting["status"] == "not_ready" and waiting["eligible"] == G * R - 1

        # A changed retry at a slot: its slot-derived report id is taken (409).
        assert send(0, 0, answers[0, 0][1], 9.0) == 409
        # Another receipt reported at a filled slot (another client): stored, never trained.
        _, extra, _ = reef.chat(prompt(2, None, 0.0, ""), cfg)
        r = reef.http.post(
            "/reef/report",
            json={"references": [extra], "score": 7.0, "metadata": grid_metadata(0, 1, 1, G, R)},
        )
        assert r.status_code == 201
        # Six eligible rollouts (the batch size), but five slots: the barrier holds.
        waiting = evolve("tttd", overrides=overrides)
        assert waiting["status"] == "not_ready" and "step 0: 5/6" in waiting["reason"]

        g, r_ = slots[-1]
        assert send(g, r_, answers[g, r_][1], 2.0) == 201
        result = evolve("tttd", overrides=overrides)
        assert result["status"] == "published", result
        assert result["gate"]["policy"] == "always"  # the recipe's default: none configured
        head = reef.head()
        assert head is not None and head["release_id"] == result["release_id"]
        assert head["recipe"] == "tttd" and head["kind"] == "adapter"
        metrics = head["metrics"]
        assert metrics["train_step"] == 0 and metrics["train_rollouts"] >= R
        assert metrics["train_reward_max"] == 2.0  # not the ignored duplicate's 7.0
        assert "train_kl_to_base" in metrics and "train_beta_mean" in metrics

        # The grid is consumed; the extra report is left over but stale under the new head.
        again = evolve("tttd", overrides=overrides)
        assert again["status"] == "not_ready"
        _, _, served = reef.chat(prompt(2, None, 0.0, ""), cfg)
        assert served == result["release_id"] != base
    finally:
        reef.close()
    chain = httpx.get(f"{server.url}/reef/scenarios/tttd/releases").json()["data"]
    assert chain[0]["parent_release_id"] == base
