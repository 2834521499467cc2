"""Shadow rollouts and A/B splits on a served Reef app (tiny model, real HTTP, SQLite, MLflow).

Shadow: the candidate answers a copy of each sampled call after the user's answer; the copies
are stored apart (never in /records, never reportable), scored against the head's answers by
the scenario's scorer, and the watcher promotes or rolls back on those scores; a full bound
drops copies and counts them. A/B: a fixed sticky split between two named releases, per-arm
numbers with anytime-valid intervals, no automatic decision, ended by an operator."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from reef.cli.main import main
from reef.cli.testing import InProcessReef
from reef.deploy import rollout
from reef.deploy.chain import ReleaseChain
from reef.gate import Decision
from reef.harness import Harness
from reef.provenance import Provenance
from reef.records import Candidate, Record, utcnow
from reef.rollouts import ARM_TAG, ROLLOUT_TAG, ab_id, arm_for
from reef.settings import RolloutSettings, load_settings
from reef.shadow import Shadows
from reef.store.sql import open_store
from tests.deploy.test_rollouts import call_in_session, chain_of, wait_for_end

ACCEPTED = Decision(status="accepted", policy="always", test="bootstrap", reason="test", n=0)
HERE = "tests.deploy.test_shadow_ab"
# Held by `blocking_scorer`: while it is clear, the one shadow copy allowed in flight waits.
RELEASE_SCORER = threading.Event()


def shadow_answer_wins(completions: list[Any], **_: Any) -> list[float]:
    """A verifier preferring the first answer it is given (the shadow's; the head's second)."""
    return [1.0] + [0.0] * (len(completions) - 1)


def head_answer_wins(completions: list[Any], **_: Any) -> list[float]:
    return [0.0] + [1.0] * (len(completions) - 1)


def blocking_scorer(completions: list[Any], **_: Any) -> list[float]:
    RELEASE_SCORER.wait(timeout=60)
    return [0.5] * len(completions)


def _shadow(scorer: str, **keys: Any) -> dict[str, Any]:
    return {"mode": "shadow", "shadow": {"sample": 1.0, "scorer": f"{HERE}:{scorer}", **keys}}


ROLLOUT = {
    "min_samples": 6,
    "confidence": 0.9,
    "check_interval_s": 0.2,
    "scenarios": {
        "shadow-better": _shadow("shadow_answer_wins", max_concurrency=64),
        "shadow-worse": _shadow("head_answer_wins", max_concurrency=64),
        "shadow-bound": _shadow("blocking_scorer", max_concurrency=1),
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    with InProcessReef(tmp_path_factory.mktemp("shadow"), rollout=ROLLOUT) as srv:
        yield srv


def _candidate(srv: InProcessReef, scenario: str, rules: str) -> Candidate:
    """A harness candidate (its rules injected), started as the scenario's shadow."""
    harness = Harness({"AGENTS.md": rules, "harness.json": '{"inject": true}'})
    with ReleaseChain.for_settings(srv.settings) as chain:
        chain.store.ensure_scenario(scenario)
        head = chain.store.head_release(scenario)
        cand = chain.add_harness_candidate(head, harness, ACCEPTED, Provenance(recipe="test"))
        return rollout.start(chain, cand)


def _shadows(srv: InProcessReef, scenario: str, n: int, timeout_s: float = 30.0) -> list[dict]:
    """The scenario's shadow records, once there are `n`."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = httpx.get(f"{srv.url}/reef/scenarios/{scenario}/shadow-records", params={"limit": 1000})
        data = r.json()["data"]
        if len(data) >= n or time.monotonic() > deadline:
            return data
        time.sleep(0.1)


@pytest.mark.loop
def test_shadow_copies_are_stored_apart_scored_and_promote_a_better_candidate(
    server: InProcessReef,
) -> None:
    scenario = "shadow-better"
    cand = _candidate(server, scenario, "Be brief.\n")
    head = cand.parent_id
    assert cand.status == "canary" and cand.gate["rollout"]["mode"] == "shadow"
    status = httpx.get(f"{server.url}/reef/scenarios/{scenario}/rollout").json()
    assert status["mode"] == "shadow" and status["canary_release_id"] == cand.id
    served = {}
    for i in range(24):
        r = call_in_session(server, scenario, f"s{i}")
        # every user is answered by the head (the candidate only once it is promoted, which
        # takes at least min_samples copies); nothing of the shadow is in the answer
        assert r.headers["x-reef-release-id"] == head or i >= 6
        served[r.headers["x-reef-agent-record-id"]] = r.json()["choices"][0]["message"]
    shadows = _shadows(server, scenario, 6)
    assert len(shadows) >= 6 and {s["record_id"] for s in shadows} <= set(served)
    for s in shadows:
        assert s["id"].startswith("shd_") and s["release_id"] == cand.id
        assert s["control_release_id"] == head and s["error"] is None
        assert s["response"]["choices"][0]["message"]["role"] == "assistant"
        assert (s["score"], s["control_score"]) == (1.0, 0.0)
        assert s["scored_by"] == f"{HERE}:shadow_answer_wins"
    # hidden: /records holds the users' records only, and a shadow record takes no report
    listed = httpx.get(f"{server.url}/reef/scenarios/{scenario}/records?limit=1000").json()
    assert {r["id"] for r in listed["data"]} == set(served)
    assert all(ARM_TAG not in r["tags"] for r in listed["data"])
    r = httpx.post(
        f"{server.url}/reef/report",
        headers={"x-reef-scenario": scenario},
        json={"score": 1.0, "references": [shadows[0]["id"]]},
    )
    assert r.status_code in (400, 404), r.text
    # the watcher decides on the copies' scores: the shadow is better, it is promoted
    wait_for_end(server, scenario, cand.id)
    top = chain_of(server, scenario)[0]
    assert top["release_id"] == cand.id and top["current"]
    assert top["metadata"]["approval"]["rollout"]["outcome"] == "promote"
    assert top["metadata"]["approval"]["rollout"]["n_canary"] >= 6


@pytest.mark.loop
def test_a_worse_shadow_is_rolled_back(server: InProcessReef) -> None:
    scenario = "shadow-worse"
    cand = _candidate(server, scenario, "Answer at length.\n")
    # a streamed answer is copied too (the copy itself is not streamed)
    with httpx.stream(
        "POST",
        f"{server.url}/v1/chat/completions",
        headers={"x-reef-scenario": scenario},
        json={"model": "tiny", "messages": [{"role": "user", "content": "yo"}], "stream": True},
        timeout=60,
    ) as r:
        assert r.status_code == 200 and "data: [DONE]" in r.read().decode()
        streamed = r.headers["x-reef-agent-record-id"]
    assert _shadows(server, scenario, 1)[0]["record_id"] == streamed
    for i in range(24):  # users see the head only; a rollback keeps its content
        assert call_in_session(server, scenario, f"s{i}").headers["x-reef-release-id"] != cand.id
    wait_for_end(server, scenario, cand.id)
    top = chain_of(server, scenario)[0]
    assert top["operation"] == "rollback" and top["parent_release_id"] == cand.parent_id
    note = top["metadata"]["rollout"]
    assert note["canary_release_id"] == cand.id and note["outcome"] == "rollback"
    shadows = _shadows(server, scenario, 1)
    assert all(s["score"] == 0.0 and s["control_score"] == 1.0 for s in shadows)


@pytest.mark.loop
def test_a_full_bound_drops_copies_and_counts_them(
    server: InProcessReef, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = "shadow-bound"
    cand = _candidate(server, scenario, "Be brief.\n")
    RELEASE_SCORER.clear()
    t0 = time.perf_counter()
    for i in range(5):  # the first copy holds the one slot (its scorer waits): 4 are dropped
        call_in_session(server, scenario, f"s{i}")
    answered_s = time.perf_counter() - t0
    RELEASE_SCORER.set()
    (only,) = _shadows(server, scenario, 1)
    assert only["release_id"] == cand.id and only["score"] == 0.5
    assert answered_s < 30  # the users never waited for the blocked copy
    text = httpx.get(f"{server.url}/metrics").text
    dropped = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("reef_shadow_calls_total{") and 'outcome="dropped"' in line
    ]
    assert dropped == [4.0], text
    assert _shadows(server, scenario, 2, timeout_s=0.5) == [only]  # nothing queued behind
    assert main(["rollout", "status", "--scenario", scenario, "--url", server.url]) == 0
    shown = capsys.readouterr().out
    assert f"shadow {cand.id} vs control {cand.parent_id} (100% of calls copied" in shown
    assert "waiting for 6 reports per arm" in shown


def test_shadow_take_respects_the_sample_and_the_bound(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'reef.db'}")
    settings = RolloutSettings(mode="shadow", shadow={"sample": 1.0, "max_concurrency": 2})
    shadows = Shadows(store, settings)
    assert [shadows.take("s") for _ in range(3)] == [True, True, False]
    assert shadows.counts[("s", "dropped")] == 1 and shadows.in_flight == 2
    sampled = Shadows(store, RolloutSettings(mode="shadow", shadow={"sample": 0.25}))
    taken = 0
    for _ in range(4000):
        if sampled.take("s"):
            taken += 1
            sampled.in_flight -= 1  # as a finished copy does
    assert 800 < taken < 1200


def test_a_failing_shadow_call_is_stored_as_failed_and_never_raises(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'reef.db'}")
    store.migrate()
    base = store.ensure_scenario("s").head_release_id
    shadows = Shadows(store, RolloutSettings(mode="shadow", shadow={"sample": 1.0}), flush_s=0.0)
    record = Record(
        id="rec_1", scenario="s", created_at=utcnow(), route="chat.completions", model="tiny",
        stream=False, request={}, response={}, release_id=base,
    )  # fmt: skip

    async def live() -> str:
        return "rel_cand"

    async def broken(release_id: str) -> dict[str, Any]:
        raise RuntimeError("engine down")

    async def run() -> None:
        assert shadows.take("s")
        shadows.launch(record, [], {}, live, broken)
        await shadows.drain()

    asyncio.run(run())
    (stored,) = store.list_shadow_records("s")
    assert stored.response is None and "engine down" in (stored.error or "")
    assert shadows.counts[("s", "failed")] == 1 and shadows.in_flight == 0
    assert store.list_records("s") == []


# A/B ------------------------------------------------------------------------------------------
def _ab_releases(state_dir: Path, scenarios: list[str]) -> dict[str, tuple[str, str]]:
    """Each scenario's base and a harness release published on it: the pair to split."""
    settings = load_settings(server={"state_dir": str(state_dir)})
    pairs = {}
    with ReleaseChain.for_settings(settings) as chain:
        chain.store.migrate()
        for scenario in scenarios:
            base = chain.store.ensure_scenario(scenario).head_release_id
            harness = Harness({"AGENTS.md": "Be brief.\n", "harness.json": '{"inject": true}'})
            published = chain.release_harness(scenario, harness)
            pairs[scenario] = (base, published.id)
    return pairs


@pytest.mark.loop
def test_ab_split_is_sticky_reported_per_arm_and_ended_by_an_operator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pairs = _ab_releases(tmp_path, ["ab-keep", "ab-stop", "ab-typo"])
    pairs["ab-typo"] = ("rel_not_on_the_chain", pairs["ab-typo"][1])
    overrides = {
        "min_samples": 6,
        "check_interval_s": 0.1,
        "scenarios": {
            name: {"mode": "ab", "ab": {"releases": list(pair), "share": 0.5}}
            for name, pair in pairs.items()
        },
    }
    with InProcessReef(tmp_path, rollout=overrides) as srv:
        a, b = pairs["ab-keep"]
        served = {}
        for i in range(40):
            r = call_in_session(srv, "ab-keep", f"s{i}")
            served[f"s{i}"] = (r.headers["x-reef-release-id"], r.headers["x-reef-agent-record-id"])
            expected = arm_for(ab_id((a, b)), f"session:s{i}", 0.5)
            assert r.headers["x-reef-release-id"] == (b if expected == "canary" else a)
        assert {release for release, _ in served.values()} == {a, b}
        again = {
            s: call_in_session(srv, "ab-keep", s).headers["x-reef-release-id"]
            for s in list(served)[:8]
        }
        assert again == {s: served[s][0] for s in again}
        counts = {a: 0, b: 0}
        for release, record_id in served.values():
            record = httpx.get(f"{srv.url}/reef/scenarios/ab-keep/records/{record_id}").json()
            assert record["release_id"] == release
            assert record["tags"][ARM_TAG] == ("b" if release == b else "a")
            assert record["tags"][ROLLOUT_TAG] == ab_id((a, b))
            httpx.post(
                f"{srv.url}/reef/report",
                headers={"x-reef-scenario": "ab-keep"},
                json={"score": float(release == b), "references": [record_id]},
            ).raise_for_status()
            counts[release] += 1
        time.sleep(0.5)  # the watcher runs, and decides nothing for a split
        status = httpx.get(f"{srv.url}/reef/scenarios/ab-keep/rollout").json()
        assert status["mode"] == "ab" and status["verdict"]["outcome"] == "running"
        arms = status["arms"]
        assert (arms["a"]["release_id"], arms["b"]["release_id"]) == (a, b)
        assert (arms["a"]["n"], arms["b"]["n"]) == (counts[a], counts[b])
        assert (arms["a"]["mean"], arms["b"]["mean"]) == (0.0, 1.0)
        assert arms["a"]["interval"][0] == 0.0 and arms["b"]["interval"][1] == 1.0
        assert arms["a"]["interval"][1] < arms["b"]["interval"][0]  # 20 each: clearly apart
        assert status["verdict"]["diff_low"] > 0
        assert main(["rollout", "status", "--scenario", "ab-keep", "--url", srv.url]) == 0
        shown = capsys.readouterr().out
        assert f"a {a}: n={counts[a]} mean=0.000" in shown and f"b {b}: n={counts[b]}" in shown
        # the operator keeps a (the default would be b): a release republishing a's content
        assert (
            main(["rollout", "promote", "--scenario", "ab-keep", "--release", a, "--url", srv.url])
            == 0
        )
        top = chain_of(srv, "ab-keep")[0]
        assert top["operation"] == "rollback" and top["metadata"]["source_release_id"] == a
        note = top["metadata"]["rollout"]
        assert note["ab"] == [a, b] and note["kept"] == a and note["arms"]["b"]["mean"] == 1.0
        assert httpx.get(f"{srv.url}/reef/scenarios/ab-keep/rollout").status_code == 404
        time.sleep(2.1)  # other processes see the end within the split cache's TTL
        after = {call_in_session(srv, "ab-keep", s).headers["x-reef-release-id"] for s in served}
        assert after == {top["release_id"]}
        # an abort ends a split keeping the head as it is
        stop_b = pairs["ab-stop"][1]
        r = httpx.post(f"{srv.url}/reef/scenarios/ab-stop/rollout/abort", json={"reason": "done"})
        assert r.status_code == 201, r.text
        assert r.json()["metadata"]["source_release_id"] == stop_b  # the head it was
        assert r.json()["metadata"]["rollout"]["reason"] == "done"
        r = httpx.post(f"{srv.url}/reef/scenarios/ab-stop/rollout/promote")
        assert r.status_code == 404 and r.json()["error"]["code"] == "no_rollout"
        # a split naming a release that is not on the chain does not run: the head serves
        head = pairs["ab-typo"][1]
        assert {
            call_in_session(srv, "ab-typo", f"s{i}").headers["x-reef-release-id"] for i in range(6)
        } == {head}
        r = httpx.get(f"{srv.url}/reef/scenarios/ab-typo/rollout")
        assert r.status_code == 404 and "rel_not_on_the_chain" in r.json()["error"]["message"]


def brief_is_better(task: str, exchange: Any, sample: int) -> str:
    """A rule judge: a reply of one word is good, anything longer bad."""
    return "\\boxed{1}" if len(exchange.reply.split()) == 1 else "\\boxed{-1}"


def test_the_judge_scores_shadow_copies_when_no_scorer_is_set() -> None:
    from reef.settings import JudgeSettings
    from reef.shadow import scorer_of

    score, name = scorer_of(None, JudgeSettings(function=f"{HERE}:brief_is_better", votes=3))
    assert name == f"function:{HERE}:brief_is_better" and score is not None
    assert score([{"role": "user", "content": "hi"}], ["Hello.", "Hello there, friend."]) == [
        1.0,
        0.0,
    ]
    assert scorer_of(None, JudgeSettings()) == (None, None)  # nothing to score with
