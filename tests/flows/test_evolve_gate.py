"""The evolve flow with the `improve` gate, run in-process against a served Reef app (the
deploy target): a candidate trained on random scores is rejected and leaves the head alone;
one trained on a consistent preference is accepted, deployed and serves."""

from __future__ import annotations

import random
from collections.abc import Iterator

import httpx
import openai
import pytest

from reef.cli.testing import InProcessReef
from reef.testing.traffic import Report, traffic


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    with InProcessReef(tmp_path_factory.mktemp("gate")) as srv:
        yield srv


def _overrides(srv: InProcessReef) -> dict:
    return {
        "server": {"state_dir": str(srv.state_dir), "port": srv.port},
        "engine": {"model": "tiny"},
        "reef": {"recipe": "sft", "batch_size": 24, "params": {"epochs": 4}},
        # the default share of evaluation samples, as the server counts them in its status
        "gate": {"policy": "improve", "confidence": 0.95},
    }


def _traffic(srv: InProcessReef, scenario: str, report: Report) -> None:
    prompt = "Is {i} a number? Answer yes or no."
    traffic(
        srv,
        scenario,
        24,
        prompt=prompt,
        report=report,
        max_tokens=6,
        temperature=1.0,
        seed=lambda i: i,
    )


def _status(srv: InProcessReef, scenario: str) -> dict:
    return httpx.get(f"{srv.url}/reef/scenarios/{scenario}/status").json()


def _chain(srv: InProcessReef, scenario: str) -> list[dict]:
    return httpx.get(f"{srv.url}/reef/scenarios/{scenario}/releases").json()["data"]


def test_random_scores_are_rejected(server: InProcessReef, prefect_server: None) -> None:
    from reef.flows.evolve import evolve

    rng = random.Random(7)
    scores = [1.0] * 12 + [0.0] * 12
    rng.shuffle(scores)
    _traffic(server, "noise", lambda i, rid: {"score": scores[i]})
    before = _chain(server, "noise")
    held = _status(server, "noise")["dropped"]["held_out"]  # the evaluation samples
    result = evolve("noise", overrides=_overrides(server), force=True)
    assert result["status"] == "rejected", result
    gate = result["gate"]
    assert gate["status"] == "rejected" and gate["n"] == held >= 2
    assert gate["ci_low"] is not None and gate["ci_low"] <= 0
    assert gate["reason"].endswith(f"(n={held})")
    assert _chain(server, "noise") == before  # the head did not move
    cands = httpx.get(f"{server.url}/reef/scenarios/noise/candidates").json()["data"]
    assert [c["status"] for c in cands] == ["rejected"]
    assert cands[0]["gate"]["reason"] == gate["reason"]


@pytest.mark.loop
def test_consistent_preference_is_accepted(server: InProcessReef, prefect_server: None) -> None:
    from reef.flows.evolve import evolve

    # The user always wanted the answer "yes": every report corrects to it.
    _traffic(server, "pref", lambda i, rid: {"score": 0.0, "feedback": {"correction": "yes"}})
    base = _chain(server, "pref")[0]
    result = evolve("pref", overrides=_overrides(server), force=True)
    assert result["status"] == "published", result
    gate = result["gate"]
    assert gate["status"] == "accepted" and gate["mean_diff"] > 0 and gate["ci_low"] > 0
    chain = _chain(server, "pref")
    assert chain[0]["release_id"] == result["release_id"] and chain[0]["current"]
    assert chain[0]["parent_release_id"] == base["release_id"]
    assert chain[0]["gate"]["status"] == "accepted"
    # the engine serves it to the next call
    client = openai.OpenAI(
        base_url=server.base_url, api_key="none", default_headers={"x-reef-scenario": "pref"}
    )
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "Is 99 a number?"}], max_tokens=3
    )
    assert raw.headers["x-reef-release-id"] == result["release_id"]


def test_a_batch_with_nothing_to_learn_is_consumed(
    server: InProcessReef, prefect_server: None
) -> None:
    """No answer passed SFT's threshold and none was corrected: the run says so, consumes the
    batch (or every later report would retrain on it), and the head stays."""
    from reef.flows.evolve import evolve

    _traffic(server, "zeros", lambda i, rid: {"score": 0.0})
    before = _chain(server, "zeros")
    held = _status(server, "zeros")["dropped"]["held_out"]
    result = evolve("zeros", overrides=_overrides(server), force=True)
    assert result["status"] == "nothing_to_train" and "threshold" in result["reason"]
    assert _chain(server, "zeros") == before
    # the training samples are consumed; the evaluation samples stay, never counted toward a
    # batch: nothing is eligible to train
    status = _status(server, "zeros")
    assert status["eligible"] == 0 and held > 0
    assert status["dropped"] == {"consumed": 24 - held, "held_out": held}
