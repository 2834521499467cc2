"""Judging through the real API and the worker's judging pass: a next turn and a text-only
report become judge reports on the records, in readiness and in `reef export`, with a rule
judge (a Python function) and with Reef's own /v1 as an LLM judge endpoint."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from reef.cli.testing import InProcessReef
from reef.experience import collect
from reef.export import export
from reef.flows.judging import Judging, build_judge, human_label
from reef.judge import Exchange, judge_quality
from reef.settings import JudgeSettings, Settings
from reef.store.sql import open_store
from reef.verdicts import LikelihoodJudge

SCENARIO = "reactions"
COMPLAINT = "Too long. Keep it to one sentence."


def rule_judge(task: str, exchange: Exchange, sample: int) -> str:
    """A rule judge (imported by dotted path, as `judge.function` names one): the next state
    complains -> -1 with a hint; thanks -> +1; anything else -> 0."""
    text = exchange.next_text.lower()
    if task == "evaluate":
        vote = -1 if "too long" in text else 1 if "thanks" in text else 0
        return f"reasoning... \\boxed{{{vote}}}"
    if "too long" in text:
        return "\\boxed{1} [HINT_START]Answer in a single short sentence.[HINT_END]"
    return "\\boxed{-1}"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    with InProcessReef(tmp_path_factory.mktemp("judging")) as s:
        yield s


def _chat(client: openai.OpenAI, messages: list[dict[str, Any]]) -> tuple[str, str]:
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=messages, max_tokens=8, temperature=0
    )
    return raw.headers["x-reef-agent-record-id"], raw.parse().choices[0].message.content or ""


def _traffic(srv: InProcessReef, scenario: str) -> dict[str, str]:
    """Two sessions: one whose first answer draws a complaint, one thanked; and a third turn
    that only gets a text-only report."""
    client = openai.OpenAI(
        base_url=srv.base_url, api_key="x", default_headers={"x-reef-scenario": scenario}
    )
    ids: dict[str, str] = {}
    first = [{"role": "user", "content": "What is Rust?"}]
    ids["complained"], answer = _chat(client, first)
    follow = [
        *first,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": COMPLAINT},
    ]
    ids["complaint_turn"], _ = _chat(client, follow)
    other = [{"role": "user", "content": "What is Go?"}]
    ids["thanked"], answer = _chat(client, other)
    thanks = [
        *other,
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "Thanks!"},
    ]
    ids["thanks_turn"], _ = _chat(client, thanks)
    ids["reported"], _ = _chat(client, [{"role": "user", "content": "What is C?"}])
    r = httpx.post(
        f"{srv.url}/reef/report",
        headers={"x-reef-scenario": scenario},
        json={"feedback": "too long", "references": [ids["reported"]]},
    )
    assert r.status_code == 201, r.text
    ids["text_report"] = r.json()["id"]
    return ids


def _settings(srv: InProcessReef, **judge: Any) -> Settings:
    return srv.settings.model_copy(update={"judge": JudgeSettings(**judge)})


def test_rule_judge_turns_reactions_into_scored_reports(srv: InProcessReef) -> None:
    ids = _traffic(srv, SCENARIO)
    settings = _settings(srv, function="tests.judge.test_judging:rule_judge")
    store = open_store(settings.database_url)
    judging = Judging(settings, store)
    try:
        assert judging.run_pass([SCENARIO]) == {SCENARIO}
        assert judging.run_pass([SCENARIO]) == set()  # nothing new: nothing judged twice
        assert judging.counts["judged"] == 3

        complained = store.get_report(SCENARIO, f"judge_{ids['complained']}")
        assert complained.score == -1.0
        assert complained.references == (ids["complained"],)
        assert complained.feedback["hints"] == ["Answer in a single short sentence."]
        assert complained.feedback["next_state"] == {"role": "user", "content": COMPLAINT}
        assert complained.metadata["votes"] == {"1": 0, "0": 0, "-1": 3, "void": 0}
        assert complained.metadata["judge"] == "function:tests.judge.test_judging:rule_judge"
        assert len(complained.metadata["raw"]["evaluate"]) == 3

        thanked = store.get_report(SCENARIO, f"judge_{ids['thanked']}")
        assert thanked.score == 1.0 and thanked.feedback["hints"] == []

        text = store.get_report(SCENARIO, f"judge_{ids['text_report']}")
        assert text.score == -1.0 and text.references == (ids["reported"],)
        assert text.metadata["judged_report_id"] == ids["text_report"]
        assert text.feedback["next_state"]["role"] == "feedback"

        # Judgments count as experience (the text-only report alone would be "no_score").
        exp = collect(store, SCENARIO, "scored", recipe="kto")
        assert {s.record_ids[0] for s in exp.samples} == {
            ids["complained"],
            ids["thanked"],
            ids["reported"],
        }
        assert exp.dropped["no_score"] == 0

        # A person's score on the same receipt wins over the judge's.
        r = httpx.post(
            f"{srv.url}/reef/report",
            headers={"x-reef-scenario": SCENARIO},
            json={"score": 1.0, "references": [ids["complained"]]},
        )
        assert r.status_code == 201
        exp = collect(store, SCENARIO, "scored", recipe="kto")
        by_record = {s.record_ids[0]: s.score for s in exp.samples}
        assert by_record[ids["complained"]] == 1.0

        # Visible on the records' reports and in `reef export`.
        listed = httpx.get(
            f"{srv.url}/reef/scenarios/{SCENARIO}/reports", params={"limit": 100}
        ).json()
        assert sum(r["metadata"].get("source") == "judge" for r in listed["data"]) == 3
        out = Path(srv.state_dir) / "export.jsonl"
        export(store, SCENARIO, out, "jsonl", progress=False)
        text_out = out.read_text()
        assert (
            '\\"source\\":\\"judge\\"' in text_out
            and "Answer in a single short sentence" in text_out
        )
    finally:
        judging.close()
        store.close()


def test_reefs_own_v1_as_the_judge_endpoint(srv: InProcessReef) -> None:
    scenario = "reactions-llm"
    ids = _traffic(srv, scenario)
    settings = _settings(srv, url=srv.base_url, model="tiny", votes=2, max_tokens=6)
    judge = build_judge(settings, scenario)
    assert judge.identity == f"endpoint:{srv.base_url}#tiny"
    store = open_store(settings.database_url)
    judging = Judging(settings, store)
    try:
        judging.run_pass([scenario])
        assert judging.counts["judged"] == 3, judging.counts
        report = store.get_report(scenario, f"judge_{ids['complained']}")
        raw = report.metadata["raw"]
        # The tiny random model answered every question (text, not a verdict): the votes are
        # void, the plurality rule makes the score 0, and the dispatch table trains nothing.
        assert len(raw["evaluate"]) == 2 and len(raw["hint"]) == 2
        assert all(isinstance(a, str) and a for a in raw["evaluate"] + raw["hint"])
        assert sum(report.metadata["votes"].values()) == 2
        assert report.score in (-1.0, 0.0, 1.0)
        # The judge's calls went through /v1 and are recorded like any traffic there: they
        # are the default scenario's, never the judged one's.
        assert len(store.list_records(scenario, limit=100)) == 5
    finally:
        judging.close()
        store.close()


def test_a_failing_judge_is_retried_then_stored_as_a_drop_with_its_reason(
    srv: InProcessReef,
) -> None:
    scenario = "reactions-down"
    ids = _traffic(srv, scenario)
    settings = _settings(srv, url="http://127.0.0.1:9/v1", model="none", timeout_s=5)
    store = open_store(settings.database_url)
    judging = Judging(settings, store)
    try:
        assert judging.run_pass([scenario]) == set()
        assert judging.counts["retried"] == 3  # judge.retries: 1
        assert judging.counts["judge_failed"] == 3 and judging.counts["judged"] == 0
        drop = store.get_report(scenario, f"judge_{ids['complained']}")
        assert drop.score is None
        assert drop.metadata["dropped"] == "judge_failed" and drop.metadata["source"] == "judge"
        # never lost silently: the scenario's status counts each drop with its reason
        status = httpx.get(f"{srv.url}/reef/scenarios/{scenario}/status").json()
        assert status["judge"]["dropped"] == {"judge_failed": 3}
        assert status["dropped"]["judge_failed"] >= 1
        # a restarted worker does not judge the dropped turns again
        again = Judging(settings, store)
        try:
            again.run_pass([scenario])
            assert again.counts["judge_failed"] == 0 and again.counts["retried"] == 0
        finally:
            again.close()
    finally:
        judging.close()
        store.close()


def test_the_default_judge_reads_by_likelihood_on_the_served_model(srv: InProcessReef) -> None:
    scenario = "reactions-default"
    ids = _traffic(srv, scenario)
    settings = _settings(srv)  # the shipped defaults: method likelihood, probe on
    judge = build_judge(settings, scenario)
    assert isinstance(judge, LikelihoodJudge)
    store = open_store(settings.database_url)
    judging = Judging(settings, store)
    try:
        assert judging.run_pass([scenario]) == {scenario}
        assert judging.counts["judged"] == 3
        report = store.get_report(scenario, f"judge_{ids['complained']}")
        md = report.metadata
        assert md["method"] == "likelihood" and md["void"] is False
        assert md["judge"].startswith("likelihood:")
        assert 0.0 < md["confidence"] <= 1.0 and md["verdict"] in (-1, 0, 1)
        assert report.score == md["verdict"]  # min_confidence 0: every verdict counts

        # a person scores a judged turn afterwards: the status compares them
        r = httpx.post(
            f"{srv.url}/reef/report",
            headers={"x-reef-scenario": scenario},
            json={"score": 0.0, "references": [ids["complained"]]},
        )
        assert r.status_code == 201
        status = httpx.get(f"{srv.url}/reef/scenarios/{scenario}/status").json()
        quality = status["judge"]
        assert quality["judged"] == 3 and quality["void_rate"] == 0.0
        assert quality["dropped"] == {}
        assert quality["judges"] == [md["judge"]]
        compared = 1 if md["verdict"] != 0 else 0
        assert quality["compared_with_people"] == compared
        if compared:
            assert quality["agreement_with_people"] == (1.0 if md["verdict"] == -1 else 0.0)
    finally:
        judging.close()
        store.close()


def test_judge_quality_counts_void_unsure_drops_and_agreement_with_people() -> None:
    from datetime import UTC, datetime, timedelta

    from reef.records import Report

    t0 = datetime(2026, 1, 1, tzinfo=UTC)

    def judgment(rid: str, verdict: int, score: float | None, **md: Any) -> Report:
        meta = {"source": "judge", "judge": "likelihood:m", "verdict": verdict, **md}
        return Report(
            id=f"judge_{rid}",
            scenario="s",
            created_at=t0,
            references=(rid,),
            score=score,
            feedback=None,
            metadata=meta,
        )

    def person(rid: str, score: float, minutes: int = 1) -> Report:
        return Report(
            id=f"p_{rid}_{minutes}",
            scenario="s",
            created_at=t0 + timedelta(minutes=minutes),
            references=(rid,),
            score=score,
            feedback=None,
            metadata={},
        )

    reports = [
        judgment("a", 1, 1.0, confidence=0.9),
        judgment("b", -1, -1.0, confidence=0.7),
        judgment("c", -1, 0.0, confidence=0.4),  # under min_confidence: unsure
        judgment("d", 0, 0.0, void=True, confidence=0.0),
        Report(
            id="judge_e",
            scenario="s",
            created_at=t0,
            references=("e",),
            score=None,
            feedback=None,
            metadata={"source": "judge", "dropped": "judge_timeout"},
        ),
        person("a", 1.0),  # agrees
        person("b", 0.0, 1),
        person("b", 1.0, 2),  # the latest word counts: disagrees
        person("c", 0.25),  # in between: not compared
        person("d", 0.0),  # the verdict 0 is not compared
    ]
    q = judge_quality(reports)
    assert q.judged == 4 and q.void == 1 and q.void_rate == 0.25 and q.unsure == 1
    assert q.dropped == {"judge_timeout": 1}
    assert q.compared == 2 and q.agreed == 1 and q.agreement == 0.5
    assert q.mean_confidence == pytest.approx((0.9 + 0.7 + 0.4 + 0.0) / 4)
    assert q.judges == ("likelihood:m",)
    assert [human_label(s) for s in (1.0, 0.5, 0.3, 0.0, -1.0)] == [1, 1, None, -1, -1]


def test_a_long_lived_worker_keeps_a_bounded_set_of_next_states() -> None:
    """The probe needs a turn's next state only if a person scores the turn: the worker keeps
    the most recent ones, and never drops one a person already scored."""
    from reef.flows.judging import NEXT_STATES_KEPT, _ScenarioState

    st = _ScenarioState()
    st.human["rec-0"] = 1.0  # scored before many later turns arrived
    for i in range(NEXT_STATES_KEPT + 100):
        st.keep_next_state(f"rec-{i}", "user", f"next {i}")
    assert len(st.next_states) == NEXT_STATES_KEPT
    assert st.next_states["rec-0"] == ("user", "next 0")
    assert "rec-1" not in st.next_states and f"rec-{NEXT_STATES_KEPT + 99}" in st.next_states
