"""The dashboard's rows (api.ui.views) built from what the store really holds: records a
server answered with their reports, release chains and candidates on SQLite and Postgres, a
figure in the artifact store, quota counters. Each row is frozen, and carries what its
template shows."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from reef.api.quotas import QuotaGate
from reef.api.ui.views.candidates import candidate_rows
from reef.api.ui.views.curves import (
    change,
    curve,
    curve_rows,
    figure_rows,
    figure_series,
    guard_series,
    headline,
)
from reef.api.ui.views.overview import overview_row
from reef.api.ui.views.quotas import QuotaRow, quota_rows
from reef.api.ui.views.records import (
    Message,
    RecordRow,
    archived_feedback,
    record_rows,
    turns,
)
from reef.api.ui.views.releases import FileDiff, Links, diff, guard_lines, release_rows
from reef.artifacts import open_artifacts
from reef.cli.testing import InProcessReef
from reef.figures import Figure, Point, load_figures, save_figure
from reef.records import Release
from reef.settings import load_settings
from reef.store.browse import Browse, RecordFilter, ScoreStats
from reef.store.sql import SQLStore, open_store
from reef.testing.traffic import traffic
from tests.store.builders import new_candidate, new_release

LINKS = Links("http://mlflow.example:5000/", "http://prefect.example:4200")


def _chat(server: InProcessReef, scenario: str, messages: list[dict[str, str]]) -> str:
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        headers={"x-reef-scenario": scenario},
        json={"model": "tiny", "messages": messages, "max_tokens": 3, "logprobs": True},
    )
    r.raise_for_status()
    return str(r.headers["x-reef-agent-record-id"])


def _report(server: InProcessReef, scenario: str, rid: str, score: float | None) -> None:
    body = {"references": [rid], "score": score, "feedback": "noted"}
    r = httpx.post(f"{server.url}/reef/report", headers={"x-reef-scenario": scenario}, json=body)
    assert r.status_code == 201, r.text


def test_record_rows_and_turns_of_a_served_session(server: InProcessReef, scenario: str) -> None:
    first = [{"role": "user", "content": "Where is   my parcel?"}]
    one = _chat(server, scenario, first)
    store = open_store(server.settings.database_url)
    try:
        answer = store.get_record(scenario, one).response["choices"][0]["message"]["content"]
        follow = [*first, {"role": "assistant", "content": answer}]
        two = _chat(server, scenario, [*follow, {"role": "user", "content": "And the refund?"}])
        _report(server, scenario, one, 1.0)
        _report(server, scenario, one, None)
        browse = Browse(store)
        got = browse.records(scenario, RecordFilter(), None, 50)
        rows = record_rows(got.records, got.feedback)
        assert [row.record.id for row in rows] == [two, one]  # newest first
        assert all(isinstance(row, RecordRow) for row in rows)
        assert rows[0].prompt == "And the refund?" and rows[0].feedback is None
        assert rows[1].prompt == "Where is my parcel?"  # whitespace folded, as shown
        assert rows[1].answer == " ".join(answer.split())
        assert rows[1].feedback is not None
        assert (rows[1].feedback.reports, rows[1].feedback.mean_score) == (2, 1.0)
        with pytest.raises(dataclasses.FrozenInstanceError):
            rows[0].prompt = "changed"  # type: ignore[misc]

        session_id = store.get_record(scenario, two).session_id
        assert session_id
        chain = store.session_records(scenario, session_id, 1000)
        reports = browse.reports_for(scenario, [r.id for r in chain])
        shown = turns(chain, reports)
    finally:
        store.close()
    assert [t.record.id for t in shown] == [one, two]
    # each turn shows only what its request added: the second, its new question
    assert shown[0].new_messages == (Message("user", "Where is   my parcel?"),)
    assert shown[1].new_messages == (Message("user", "And the refund?"),)
    assert shown[0].answer == answer
    assert [p.score for p in shown[0].reports] == [1.0, None] and shown[1].reports == ()
    assert len(shown[0].cells) == len(shown[0].record.logprobs or [])
    assert all(c.colour.startswith("heat-") for c in shown[0].cells)
    # the harness's injection (reef.* tags) apart from the client's own tags
    tagged = dataclasses.replace(chain[0], tags={"reef.system": "Be brief.", "user": "u1"})
    (alone,) = turns([tagged], {})
    assert (alone.injection, alone.tags) == ({"reef.system": "Be brief."}, {"user": "u1"})
    # what the archive page says of reports it read: their number and mean score
    assert archived_feedback(reports)[one] == rows[1].feedback
    assert two not in archived_feedback(reports)


def test_overview_row_of_served_traffic(server: InProcessReef, scenario: str) -> None:
    traffic(server, scenario, 3, report=lambda i, rid: {"score": float(i % 2)}, max_tokens=2)
    store = open_store(server.settings.database_url)
    try:
        head = store.head_release(scenario)
        store.add_candidate(new_candidate(scenario, head.id))
        browse = Browse(store)
        row = overview_row(
            scenario,
            head=head,
            traffic=browse.traffic(scenario),
            candidates=store.list_candidates(scenario),
            chain=store.list_releases(scenario),
            scores=browse.release_scores(scenario),
        )
    finally:
        store.close()
    assert row.name == scenario and row.head.id == head.id and row.releases == 1
    assert row.traffic.records == 3 and row.traffic.feedback_rate == 1.0
    assert len(row.bars) == len(row.traffic.hourly)
    assert max(b.h for b in row.bars) == 28  # this hour's bar is the tallest, full height
    assert row.last is not None and row.last.status == "pending" and row.pending == 1
    assert row.curve.startswith("0.0,")  # one release with a mean score: one point
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.pending = 0  # type: ignore[misc]


def _chain(store: SQLStore, name: str) -> tuple[Release, Release, Release]:
    """A base release, a trained one (gate, model version, flow run, approval) and a harness
    rollback to the base."""
    base = store.ensure_scenario(name).head_release_id
    gate = {"policy": "paired", "n": 12, "mean_candidate": 0.75, "reason": "", "extra": 1}
    meta = {"flow_run_id": "run-1", "approval": {"by": "ops", "via": "dashboard"}}
    trained = store.publish_release(
        new_release(
            name,
            base,
            gate=gate,
            metadata=meta,
            metrics={"train_loss": 0.5, "flag": True, "rows": 12},
        )
    )
    back = store.publish_release(
        new_release(
            name,
            trained.id,
            kind="base",
            operation="rollback",
            model_uri=None,
            gate={},
            metrics={},
            metadata={"source_release_id": base, "harness": {"AGENTS.md": "x"}},
        )
    )
    return store.get_release(name, base), trained, back


def test_release_and_candidate_rows(store: SQLStore) -> None:
    base, trained, back = _chain(store, "views")
    rows = release_rows(store.list_releases("views"), {}, LINKS)
    assert [row.release.id for row in rows] == [back.id, trained.id, base.id]  # head first
    t = rows[1]
    # the gate's numbers in the timeline's order, unset and unknown ones left out
    assert list(t.gate.items()) == [("policy", "paired"), ("n", 12), ("mean_candidate", 0.75)]
    assert t.mlflow == "http://mlflow.example:5000/#/models/reef-support/versions/3"
    assert t.flow_run == "http://prefect.example:4200/runs/flow-run/run-1"
    assert t.approval == {"by": "ops", "via": "dashboard"} and t.score is None
    assert (t.source, t.harness) == (None, False)
    assert (rows[0].source, rows[0].harness, rows[0].mlflow) == (base.id, True, None)
    # no MLflow server to link (a file store) and no Prefect UI: no links
    plain = release_rows(store.list_releases("views"), {}, Links("sqlite:///m.db", None))
    assert (plain[1].mlflow, plain[1].flow_run) == (None, None)

    waiting = store.add_candidate(new_candidate("views", back.id, gate={"status": "held"}))
    # a candidate that becomes a release (promoted: the release takes the candidate's id)
    became = store.add_candidate(new_candidate("views", back.id))
    approval = {"by": "ops", "via": "dashboard"}
    store.publish_release(
        new_release("views", back.id, id=became.id, metadata={"approval": approval})
    )
    cands = candidate_rows(store.list_candidates("views"), store.list_releases("views"), LINKS)
    by_id = {row.candidate.id: row for row in cands}
    assert by_id[waiting.id].pending and by_id[waiting.id].gate == {"status": "held"}
    assert by_id[waiting.id].approval is None and by_id[waiting.id].mlflow is None
    # its approval is recorded on the release it became
    assert by_id[became.id].approval == approval
    with pytest.raises(dataclasses.FrozenInstanceError):
        cands[0].gate = {}  # type: ignore[misc]


def test_curve_and_figure_rows(store: SQLStore, tmp_path: Path) -> None:
    base, trained, back = _chain(store, "curves")
    chain = store.list_releases("curves")
    artifacts = open_artifacts(str(tmp_path / "artifacts"))
    points = (Point(base.id, 0.25), Point(trained.id, 0.625), Point("rel_elsewhere", 0.9))
    save_figure(artifacts, "curves", Figure("pass", "held-out pass rate", "demo", points))
    figures, problems = load_figures(artifacts, "curves")
    assert problems == []

    series = figure_series(chain, figures)
    assert [(s.name, s.key, s.figure) for s in series] == [
        ("held-out pass rate", "figure:pass", True),
        ("rows", "metric:rows", False),  # numbers only: the flag is no series
        ("train_loss", "metric:train_loss", False),
    ]
    assert series[0].values == (0.25, 0.625, None) and series[0].off_chain == 1
    # what the chart script reads: off_chain only where a figure has points off the chain
    assert series[0].json()["off_chain"] == 1 and "off_chain" not in series[2].json()
    assert series[2].json()["values"] == [None, 0.5, None]

    shown = [s for s in series if s.figure]
    table = figure_rows(chain, shown)  # newest first, releases with a value only
    assert [(row.release.id, row.values) for row in table] == [
        (trained.id, (0.625,)),
        (base.id, (0.25,)),
    ]
    rows = curve_rows(chain, {})
    assert [row.release.id for row in rows] == [back.id, trained.id, base.id]
    assert all(row.score is None for row in rows)
    assert curve(chain, {})["gate"] == [None, 0.75, None]


def _guarded_chain(store: SQLStore, name: str) -> list[Release]:
    """A base and two releases, each published by a gate with a correctness guard (held-out
    means: base 0.6875 as the first gate's head, then 0.625, then 0.5625)."""
    head = store.ensure_scenario(name).head_release_id
    for cand, prior in ((0.625, 0.6875), (0.5625, 0.625)):
        guard = {"name": "correct", "broken": False, "reason": "held", "n": 16, "max_drop": 0.1}
        guard |= {"mean_candidate": cand, "mean_head": prior, "wins": 15, "losses": 1}
        gate = {"status": "accepted", "policy": "always", "n": 0, "guards": [guard]}
        head = store.publish_release(new_release(name, head, gate=gate)).id
    return store.list_releases(name)


def test_the_learning_page_leads_with_held_out_figures_and_guards(
    store: SQLStore, tmp_path: Path
) -> None:
    chain = _guarded_chain(store, "lead")
    base, _, second = chain
    # each guard's held-out mean per release: the base's from the first gate's head
    (correct,) = guard_series(chain)
    assert (correct.name, correct.values) == ("guard correct", (0.6875, 0.625, 0.5625))
    lines = guard_lines(second.gate)
    assert [(g.name, g.safe, g.candidate, g.head, g.n) for g in lines] == [
        ("correct", True, 0.5625, 0.625, 16)
    ]
    assert guard_lines({"guards": [{"name": "x", "broken": True, "n": 1}]})[0].safe is False

    # a held-out figure leads, then the guard, then the reported score (0/1 thumbs on base)
    points = (Point(base.id, 0.125), Point(second.id, 0.875))
    figures = [Figure("pass", "held-out pass rate", "demo", points)]
    scores = {base.id: ScoreStats.of(8, 2.0, 2.0, 0.0, 1.0)}
    lead = headline(chain, scores, figure_series(chain, figures))
    assert [s.name for s in lead] == ["held-out pass rate", "guard correct", "mean reported score"]
    rise = change(chain, lead[0])
    assert rise is not None and (rise.first, rise.last) == (0.125, 0.875)
    assert (rise.first_seq, rise.last_seq, rise.delta) == (0, 2, 0.75)
    # the guard's drop is shown as such, not averaged away
    drop = change(chain, lead[1])
    assert drop is not None and drop.delta == pytest.approx(-0.125)
    # the chart gets the figure and the guard on the score's axis
    drawn = curve(chain, scores, lead[:2])
    assert drawn["lines"] == [
        {"name": "held-out pass rate", "values": [0.125, None, 0.875]},
        {"name": "guard correct", "values": [0.6875, 0.625, 0.5625]},
    ]
    # the thumbs' interval stays inside [0, 1] (the normal one was [-0.05, 0.55])
    assert drawn["low"][0] == pytest.approx(0.0715, abs=1e-4) and drawn["high"][0] <= 1.0

    # the overview's sparkline is the headline: the held-out figure, first → latest
    row = overview_row(
        "lead",
        head=second,
        traffic=Browse(store).traffic("lead"),
        candidates=[],
        chain=chain,
        scores=scores,
        figures=figures,
    )
    assert [(c.name, c.first, c.last) for c in row.lead] == [
        ("held-out pass rate", 0.125, 0.875),
        ("guard correct", 0.6875, 0.5625),
    ]
    assert len(row.curve.split()) == 3
    # every release shows its figures and its gate's guards
    newest, middle, oldest = release_rows(chain, scores, LINKS, figures)
    assert (newest.figures, middle.figures) == ((("held-out pass rate", 0.875),), ())
    assert [g.candidate for g in newest.guards] == [0.5625] and oldest.guards == ()
    # a named metric's mean per release follows the reported score
    helpful = {base.id: {"helpful": ScoreStats.of(4, 3.0, 3.0, 0.0, 1.0)}}
    assert [s.name for s in headline(chain, scores, [], helpful)][-1] == "mean helpful"
    # without figures it leads with the guard
    plain = overview_row(
        "lead", head=second, traffic=row.traffic, candidates=[], chain=chain, scores=scores
    )
    assert [c.name for c in plain.lead] == ["guard correct", "mean reported score"]


def test_harness_diff_rows() -> None:
    old = {"AGENTS.md": "Be brief.\n", "gone.md": "x"}
    new = {"AGENTS.md": "Answer in one word.\n", "new.md": "y"}
    files = diff(old, new)
    assert [(f.path, f.status) for f in files] == [
        ("AGENTS.md", "changed"),
        ("gone.md", "removed"),
        ("new.md", "added"),
    ]
    assert isinstance(files[0], FileDiff) and "+Answer in one word." in files[0].lines
    assert files[2].lines[:2] == ("--- /dev/null", "+++ b/new.md")
    assert diff(old, old) == []


def test_quota_rows_from_counted_use(store: SQLStore) -> None:
    settings = load_settings(
        None,
        auth={
            "tokens": [
                {"name": "ops", "sha256": "a" * 64, "admin": True},
                {"name": "rpm", "sha256": "b" * 64, "quota": {"requests_per_minute": 3}},
                {
                    "name": "sc",
                    "sha256": "c" * 64,
                    "scenario_quotas": {"b": {"tokens_per_day": 50}},
                },
            ]
        },
    )
    gate = QuotaGate(settings.auth.tokens, store.quotas, CollectorRegistry())
    assert store.quotas.admit(gate.counters("rpm", "a")) is None  # one request counted
    store.quotas.spend(gate.counters("rpm", "a"), 7)
    store.quotas.spend(gate.counters("sc", "b"), 11)
    usage = gate.usage()
    assert quota_rows(usage, "ops", admin=True) == [
        QuotaRow("rpm", "all", "requests_per_minute", 1, 3, 60),
        QuotaRow("sc", "b", "tokens_per_day", 11, 50, 86400),
    ]
    # another token sees its own limits only
    assert quota_rows(usage, "sc", admin=False) == [
        QuotaRow("sc", "b", "tokens_per_day", 11, 50, 86400)
    ]
    assert quota_rows(usage, "ops", admin=False) == []
