"""Canary rollouts on a served Reef app (tiny model, real HTTP, SQLite, MLflow): the canary
serves a sticky share of sessions, reports on each arm feed the sequential test, and the watcher
promotes or rolls back through the one release path; a candidate made on a canary that was
rolled back cannot publish on its stale parent (the compare-and-swap refuses it)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from reef.cli.main import main
from reef.cli.testing import InProcessReef
from reef.deploy import rollout
from reef.deploy.chain import ReleaseChain
from reef.errors import BadRequest, Conflict, HeadMoved
from reef.gate import Decision
from reef.harness import Harness
from reef.provenance import Provenance
from reef.records import Candidate
from reef.rollouts import ARM_TAG, arm_for, sticky_key
from reef.sequential import Health
from reef.settings import load_settings

ROLLOUT = {
    "mode": "canary",
    "share": 0.5,
    "min_samples": 6,
    "confidence": 0.9,
    "check_interval_s": 0.2,
    # Latency on two shared cores is noise at this size: the guardrail's latency half is
    # tested on its own (test_guardrail_aborts_and_admin_routes, tests/test_sequential.py).
    "max_p95_ratio": 100.0,
}
ACCEPTED = Decision(status="accepted", policy="always", test="bootstrap", reason="test", n=0)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    with InProcessReef(tmp_path_factory.mktemp("rollouts"), rollout=ROLLOUT) as srv:
        yield srv


def _canary(srv: InProcessReef, scenario: str, rules: str) -> Candidate:
    """A harness candidate (its rules injected, so each arm answers differently), started as
    the scenario's canary."""
    harness = Harness({"AGENTS.md": rules, "harness.json": '{"inject": true}'})
    with ReleaseChain.for_settings(srv.settings) as chain:
        chain.store.ensure_scenario(scenario)
        head = chain.store.head_release(scenario)
        cand = chain.add_harness_candidate(head, harness, ACCEPTED, Provenance(recipe="test"))
        started = rollout.start(chain, cand)
    assert started.status == "canary" and started.gate["rollout"]["share"] == 0.5
    return started


def call_in_session(srv: InProcessReef, scenario: str, session: str) -> httpx.Response:
    r = httpx.post(
        f"{srv.url}/v1/chat/completions",
        headers={"x-reef-scenario": scenario, "x-reef-session-id": session},
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        timeout=60,
    )
    r.raise_for_status()
    return r


def _traffic(srv: InProcessReef, scenario: str, sessions: int) -> dict[str, tuple[str, str]]:
    """One call per session. Returns session -> (release id, record id)."""
    served = {}
    for i in range(sessions):
        r = call_in_session(srv, scenario, f"s{i}")
        served[f"s{i}"] = (r.headers["x-reef-release-id"], r.headers["x-reef-agent-record-id"])
    return served


def _report(
    srv: InProcessReef, scenario: str, served: dict[str, tuple[str, str]], canary_score: float
) -> None:
    """A report per record: `canary_score` on the canary arm's, 1 − it on the control's."""
    for _, record_id in served.values():
        record = httpx.get(f"{srv.url}/reef/scenarios/{scenario}/records/{record_id}").json()
        arm = record["tags"][ARM_TAG]
        score = canary_score if arm == "canary" else 1.0 - canary_score
        httpx.post(
            f"{srv.url}/reef/report",
            headers={"x-reef-scenario": scenario},
            json={"score": score, "references": [record_id]},
        ).raise_for_status()


def chain_of(srv: InProcessReef, scenario: str) -> list[dict]:
    return httpx.get(f"{srv.url}/reef/scenarios/{scenario}/releases").json()["data"]


def wait_for_end(srv: InProcessReef, scenario: str, canary: str, timeout_s: float = 30.0) -> None:
    """Until `canary`'s rollout has ended and the release that ended it is on the chain (the
    canary itself, promoted, or a rollback release naming it). A rollback retires the canary
    (compare-and-swap: one replica acts) before it deploys its release, so for that deploy's
    few seconds there is no rollout yet the chain does not show its end."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if httpx.get(f"{srv.url}/reef/scenarios/{scenario}/rollout").status_code == 404:
            top = chain_of(srv, scenario)[0]
            rollout = top["metadata"].get("rollout") or {}
            if canary in (top["release_id"], rollout.get("canary_release_id")):
                return
        time.sleep(0.2)
    raise AssertionError("the rollout did not end")


@pytest.mark.loop
def test_sticky_arms_and_a_better_canary_is_promoted(server: InProcessReef) -> None:
    scenario = "canary-better"
    cand = _canary(server, scenario, "Be brief.\n")
    base = cand.parent_id
    served = _traffic(server, scenario, 40)
    arms = {release for release, _ in served.values()}
    assert arms == {cand.id, base}  # both arms served, each session by one release
    for session, (release, _) in served.items():
        expected = arm_for(cand.id, f"session:{session}", 0.5)
        assert (release == cand.id) == (expected == "canary")
    # the same session again: the same arm
    again = {
        s: call_in_session(server, scenario, s).headers["x-reef-release-id"]
        for s in list(served)[:8]
    }
    assert again == {s: served[s][0] for s in again}
    _report(server, scenario, served, canary_score=1.0)
    wait_for_end(server, scenario, cand.id)
    chain = chain_of(server, scenario)
    assert chain[0]["release_id"] == cand.id and chain[0]["current"]
    assert chain[0]["parent_release_id"] == base
    approval = chain[0]["metadata"]["approval"]
    assert approval["via"] == "rollout" and approval["rollout"]["outcome"] == "promote"
    cands = httpx.get(f"{server.url}/reef/scenarios/{scenario}/candidates").json()["data"]
    assert cands[0]["status"] == "published"
    # after the rollout, every session gets the new head
    assert call_in_session(server, scenario, "s0").headers["x-reef-release-id"] == cand.id


@pytest.mark.loop
def test_a_worse_canary_is_rolled_back_and_a_candidate_on_it_cannot_publish(
    server: InProcessReef,
) -> None:
    scenario = "canary-worse"
    cand = _canary(server, scenario, "Answer at length.\n")
    head = cand.parent_id
    _report(server, scenario, _traffic(server, scenario, 40), canary_score=0.0)
    wait_for_end(server, scenario, cand.id)
    chain = chain_of(server, scenario)
    top = chain[0]
    assert top["current"] and top["operation"] == "rollback" and top["parent_release_id"] == head
    note = top["metadata"]["rollout"]
    assert note["canary_release_id"] == cand.id and note["outcome"] == "rollback"
    assert note["reason"].startswith("canary worse") and note["n_canary"] >= 6
    assert cand.id not in [r["release_id"] for r in chain]  # never on the chain
    cands = httpx.get(f"{server.url}/reef/scenarios/{scenario}/candidates").json()["data"]
    assert cands[0]["status"] == "rolled_back" and cands[0]["message"] == note["reason"]

    # A candidate an evolve run made while the canary was live was made on the head of that
    # moment; the rollback release moved the head, so it cannot publish on its stale parent.
    with ReleaseChain.for_settings(server.settings) as chain_ops:
        assert chain_ops.store.get_candidate(scenario, cand.id).status == "rolled_back"
        harness = Harness({"AGENTS.md": "Trained during the canary.\n"})
        during = chain_ops.add_harness_candidate(
            chain_ops.store.get_release(scenario, head),
            harness,
            ACCEPTED,
            Provenance(recipe="test"),
        )
        with pytest.raises((HeadMoved, Conflict)):
            chain_ops.publish(during)
        assert chain_ops.store.get_candidate(scenario, during.id).status == "failed"
        assert chain_ops.store.head_release(scenario).id == top["release_id"]


@pytest.mark.loop
def test_guardrail_aborts_and_admin_routes(
    server: InProcessReef, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = "canary-errors"
    cand = _canary(server, scenario, "Be terse.\n")
    status = httpx.get(f"{server.url}/reef/scenarios/{scenario}/rollout").json()
    assert status["canary_release_id"] == cand.id and status["verdict"]["outcome"] == "continue"
    assert "waiting for 6 reports per arm" in status["verdict"]["reason"]
    with ReleaseChain.for_settings(server.settings) as chain:
        sick = (Health(40, 12, 100.0), Health(200, 1, 90.0))
        ended = rollout.check(chain, scenario, sick)
    assert ended is not None and ended.operation == "rollback"
    assert ended.metadata["rollout"]["by"] == "guardrail"
    assert "error rate" in ended.metadata["rollout"]["reason"]
    assert httpx.get(f"{server.url}/reef/scenarios/{scenario}/rollout").status_code == 404
    # an operator's abort and promote: the admin routes (loopback without tokens is admin)
    second = _canary(server, scenario, "Be kind.\n")
    assert main(["rollout", "status", "--scenario", scenario, "--url", server.url]) == 0
    shown = capsys.readouterr().out
    assert f"canary {second.id} vs control" in shown and "continue:" in shown
    r = httpx.post(
        f"{server.url}/reef/scenarios/{scenario}/rollout/abort", json={"reason": "by hand"}
    )
    assert r.status_code == 201, r.text
    assert r.json()["metadata"]["rollout"]["reason"] == "by hand"
    third = _canary(server, scenario, "Be precise.\n")
    assert main(["rollout", "promote", "--scenario", scenario, "--url", server.url]) == 0
    assert f"release {third.id}" in capsys.readouterr().out
    assert chain_of(server, scenario)[0]["release_id"] == third.id != second.id
    r = httpx.post(f"{server.url}/reef/scenarios/{scenario}/rollout/promote")
    assert r.status_code == 404 and r.json()["error"]["code"] == "no_rollout"


def test_a_full_weights_canary_on_vllm_is_refused(tmp_path: Path) -> None:
    settings = load_settings(
        server={"state_dir": str(tmp_path)},
        engine={"kind": "vllm", "model": "tiny"},
        rollout=ROLLOUT,
    )
    with ReleaseChain.for_settings(settings) as chain:
        chain.store.migrate()
        head = chain.store.ensure_scenario("canary-vllm")
        release = chain.store.head_release(head.name)
        cand = Candidate(
            id="rel_checkpoint",
            scenario=head.name,
            parent_id=release.id,
            kind="checkpoint",
            created_at=release.created_at,
            status="pending",
            uri="/nowhere",
            content_hash="x",
            recipe="sft",
            dataset_id=None,
            metrics={},
            gate={},
            model_uri=None,
            updated_at=release.created_at,
        )
        with pytest.raises(BadRequest, match="second engine") as e:
            chain.start_canary(cand, {})
    assert e.value.code == "canary_needs_second_engine"


def test_sticky_keys() -> None:
    msgs = [{"role": "system", "content": "x"}, {"role": "user", "content": "hello"}]
    by_first = sticky_key("session", session_id=None, user_id=None, tags={}, messages=msgs)
    longer = [*msgs, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}]
    assert by_first == sticky_key(
        "session", session_id=None, user_id=None, tags={}, messages=longer
    )  # every turn of a conversation keys the same
    assert sticky_key("user", session_id="s", user_id="u1", tags={}, messages=msgs) == "user:u1"
    assert sticky_key("tag:team", session_id=None, user_id=None, tags={"team": "a"}, messages=[])
    assert sticky_key("user", session_id="s", user_id=None, tags={}, messages=msgs) is None
    share = sum(arm_for("rel_x", f"k{i}", 0.1) == "canary" for i in range(10000)) / 10000
    assert 0.09 < share < 0.11


@pytest.mark.loop
@pytest.mark.postgres
def test_arms_are_sticky_across_replicas_and_restarts(
    tmp_path: Path, make_postgres_database: Callable[[], str]
) -> None:
    """Two replicas sharing one Postgres give every session the same arm, and so does a
    replica started after the others stopped: the arm is a hash, not state."""
    shared = {
        "store": {"database_url": make_postgres_database()},
        "artifacts": {"url": str(tmp_path / "artifacts")},
        "tracking": {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}"},
        "rollout": ROLLOUT,
    }
    sessions = [f"user-{i}" for i in range(16)]
    with (
        InProcessReef(tmp_path / "a", **shared) as a,
        InProcessReef(tmp_path / "b", **shared) as b,
    ):
        cand = _canary(a, "sticky", "Be brief.\n")
        on_a = {s: call_in_session(a, "sticky", s).headers["x-reef-release-id"] for s in sessions}
        on_b = {s: call_in_session(b, "sticky", s).headers["x-reef-release-id"] for s in sessions}
    assert on_a == on_b and set(on_a.values()) == {cand.id, cand.parent_id}
    with InProcessReef(tmp_path / "c", **shared) as c:
        after = {s: call_in_session(c, "sticky", s).headers["x-reef-release-id"] for s in sessions}
    assert after == on_a
