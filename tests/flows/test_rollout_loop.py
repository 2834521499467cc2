"""The loop with rollouts, end to end on the tiny model: traffic → evolve → the release starts
as a 10 % canary → reports favour it → the watcher promotes it; a later, worse release → its
canary loses → the watcher rolls it back. The release chain shows all of it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from reef.cli.testing import InProcessReef
from reef.testing.traffic import traffic

ROLLOUT = {
    "mode": "canary",
    "share": 0.1,
    "min_samples": 5,
    "confidence": 0.9,
    "check_interval_s": 0.3,
    "max_p95_ratio": 100.0,  # latency on shared test cores is noise
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    with InProcessReef(tmp_path_factory.mktemp("rollout-loop"), rollout=ROLLOUT) as srv:
        yield srv


def _overrides(srv: InProcessReef) -> dict[str, Any]:
    return {
        "server": {"state_dir": str(srv.state_dir), "port": srv.port},
        "engine": {"model": "tiny"},
        "reef": {"recipe": "sft", "batch_size": 24, "params": {"epochs": 2}},
        "gate": {"policy": "always"},
        "rollout": ROLLOUT,
    }


def _sessions(
    srv: InProcessReef, scenario: str, canary: str, n: int, canary_wins: bool, start: int = 0
) -> int:
    """`n` one-call sessions, each reported: 1 for the arm that should win, 0 for the other.
    Returns how many the canary served."""
    served = 0
    for i in range(start, start + n):
        r = httpx.post(
            f"{srv.url}/v1/chat/completions",
            headers={"x-reef-scenario": scenario, "x-reef-session-id": f"{canary}-{i}"},
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": f"q{i}"}],
                "max_tokens": 2,
            },
            timeout=60,
        )
        r.raise_for_status()
        on_canary = r.headers["x-reef-release-id"] == canary
        served += on_canary
        httpx.post(
            f"{srv.url}/reef/report",
            headers={"x-reef-scenario": scenario},
            json={
                "score": float(on_canary == canary_wins),
                "references": [r.headers["x-reef-agent-record-id"]],
            },
        ).raise_for_status()
    return served


def _ended(srv: InProcessReef, scenario: str, head: str, timeout_s: float = 30.0) -> list[dict]:
    """The chain once the rollout has ended and its release is on it. A rollback retires the
    canary (compare-and-swap, so one replica acts) before it deploys the rollback release: for
    that deploy's few seconds there is no rollout and the head is still `head`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if httpx.get(f"{srv.url}/reef/scenarios/{scenario}/rollout").status_code == 404:
            chain = httpx.get(f"{srv.url}/reef/scenarios/{scenario}/releases").json()["data"]
            if chain[0]["release_id"] != head:
                return list(chain)
        time.sleep(0.3)
    raise AssertionError("the rollout did not end")


def _until_ended(
    srv: InProcessReef, scenario: str, canary: str, canary_wins: bool, most: int = 600
) -> tuple[int, list[dict]]:
    """Sessions in batches of 40 until the watcher ends the rollout (how many the canary
    serves is a draw: 10 % of sessions, by hash), at most `most`. Returns how many the canary
    served and the chain."""
    head = httpx.get(f"{srv.url}/reef/scenarios/{scenario}").json()["head_release_id"]
    served = 0
    for start in range(0, most, 40):
        served += _sessions(srv, scenario, canary, 40, canary_wins, start)
        try:
            return served, _ended(srv, scenario, head, timeout_s=3.0)
        except AssertionError:
            continue
    return served, _ended(srv, scenario, head)


@pytest.mark.loop
@pytest.mark.timeout(900)  # two evolve runs and 240 reported sessions on two shared cores
def test_canary_promoted_then_a_worse_one_rolled_back(
    server: InProcessReef, prefect_server: None
) -> None:
    from reef.flows.evolve import evolve

    scenario = "rollout-loop"
    traffic(
        server,
        scenario,
        24,
        prompt="Is {i} a number? Answer yes or no.",
        report=lambda i, rid: {"score": 0.0, "feedback": {"correction": "yes"}},
        max_tokens=4,
    )
    base = httpx.get(f"{server.url}/reef/scenarios/{scenario}/releases").json()["data"][0]
    first = evolve(scenario, overrides=_overrides(server))
    assert first["status"] == "canary", first
    canary = first["release_id"]
    status = httpx.get(f"{server.url}/reef/scenarios/{scenario}/rollout").json()
    assert status["share"] == 0.1 and status["control_release_id"] == base["release_id"]

    # ~10 % of sessions until the watcher promotes the canary, all of them after
    served, chain = _until_ended(server, scenario, canary, canary_wins=True)
    assert served >= 5  # min_samples
    assert chain[0]["release_id"] == canary and chain[0]["current"]
    assert chain[0]["metadata"]["approval"]["rollout"]["outcome"] == "promote"

    # a later release that users like less
    second = evolve(scenario, overrides=_overrides(server), force=True)
    assert second["status"] == "canary", second
    worse = second["release_id"]
    _, chain = _until_ended(server, scenario, worse, canary_wins=False)
    top = chain[0]
    assert top["current"] and top["operation"] == "rollback"
    assert top["metadata"]["rollout"]["canary_release_id"] == worse
    assert top["metadata"]["rollout"]["outcome"] == "rollback"
    assert [r["release_id"] for r in chain[1:]] == [canary, base["release_id"]]
    cands = httpx.get(f"{server.url}/reef/scenarios/{scenario}/candidates").json()["data"]
    assert {c["release_id"]: c["status"] for c in cands} == {
        worse: "rolled_back",
        canary: "published",
    }
