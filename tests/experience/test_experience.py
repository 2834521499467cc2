"""Experience: feedback joins, the report rule, staleness, consumed-once, token continuity."""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import timedelta

import pytest

from reef.experience import collect, consume
from reef.readiness import readiness
from reef.records import USER_TAG, Candidate, Slice, new_id, utcnow
from reef.samples import PreferenceSample, RolloutSample, ScoredSample, TrajectorySample
from reef.settings import LoopSettings
from reef.store.sql import SQLStore
from tests.experience.conftest import append_release, record, report, session

S = "exp"


def _base(store: SQLStore) -> str:
    return store.ensure_scenario(S).head_release_id


def test_multi_receipt_report_is_one_trajectory_sample(store: SQLStore) -> None:
    base = _base(store)
    turns = session(S, base, 3)
    store.add_records(turns)
    # quoted out of order: the sample still follows the session's turns
    store.add_report(report(S, turns[2].id, turns[0].id, turns[1].id, score=0.75))

    exp = collect(store, S, "trajectory", recipe="harness", page_size=2)
    assert len(exp.samples) == 1 and not exp.dropped
    (sample,) = exp.samples
    assert isinstance(sample, TrajectorySample)
    assert sample.record_ids == tuple(r.id for r in turns)
    assert [t.turn for t in sample.turns] == [0, 1, 2]
    assert [t.release_id for t in sample.turns] == [base] * 3
    assert sample.turns[2].prompt_token_ids == tuple(turns[2].prompt_token_ids or [])
    assert sample.session_id == turns[0].session_id and sample.score == 0.75

    scored = collect(store, S, "scored", recipe="sft")
    (one,) = scored.samples
    assert isinstance(one, ScoredSample)
    assert one.completion == "a2" and one.messages[-1] == {"role": "user", "content": "q2"}

    rollout = collect(store, S, "rollout", recipe="grpo")
    (ro,) = rollout.samples
    assert isinstance(ro, RolloutSample)
    full = list(turns[2].prompt_token_ids or []) + list(turns[2].completion_token_ids or [])
    assert list(ro.prompt_token_ids) + list(ro.completion_token_ids) == full
    # generated tokens are masked in, the inserted user turns out
    assert ro.completion_mask == (1, 1, 0, 1, 1, 0, 1, 1)
    assert ro.logprobs == (-0.5, -0.1, 0.0, -0.5, -0.1, 0.0, -0.5, -0.1)


def test_several_reports_are_kept_and_the_rule_picks(store: SQLStore) -> None:
    base = _base(store)
    rec = record(S, base)
    store.add_records([rec])
    t0 = utcnow()
    first = report(S, rec.id, score=0.1, created_at=t0)
    second = report(S, rec.id, score=0.9, created_at=t0 + timedelta(seconds=1))
    store.add_report(second)
    store.add_report(first)

    def sample(rule: str) -> ScoredSample:
        (s,) = collect(store, S, "scored", recipe="sft", rule=rule).samples  # type: ignore[arg-type]
        assert isinstance(s, ScoredSample)
        return s

    latest = sample("latest")
    assert (latest.score, latest.report_id) == (0.9, second.id)
    assert latest.report_ids == (first.id, second.id)
    assert sample("first").score == 0.1
    assert sample("mean").score == pytest.approx(0.5)


def test_stale_samples_are_dropped_alone(store: SQLStore) -> None:
    base = _base(store)
    r1 = append_release(store, S)
    r2 = append_release(store, S)  # the chain: base (0), r1 (1), r2 (2, head)
    old, mid, fresh = (record(S, rel) for rel in (base, r1.id, r2.id))
    stranger = record(S, "rel_not_on_the_chain")
    store.add_records([old, mid, fresh, stranger])
    for rec in (old, mid, fresh, stranger):
        store.add_report(report(S, rec.id, score=1.0))

    exp = collect(store, S, "scored", recipe="sft", max_staleness=1)
    assert exp.dropped == Counter(stale=1, unknown_release=1)
    assert {s.record_ids[0]: s.staleness for s in exp.samples} == {mid.id: 1, fresh.id: 0}

    ready = readiness(store, S, LoopSettings(batch_size=2, max_staleness=1))
    assert (ready.eligible, ready.ready) == (2, True)
    assert ready.dropped == Counter(stale=1, unknown_release=1)


def test_records_a_canary_served_are_experience_naming_it(store: SQLStore) -> None:
    """A live canary's records, and a rolled-back one's, are samples like any other, counted
    at the seq of the release they were made on; the sample names the release."""
    base = _base(store)
    head = append_release(store, S)  # base (0), head (1)

    def canary(status: str) -> Candidate:
        made = store.add_candidate(
            Candidate(
                id=new_id("rel"), scenario=S, parent_id=head.id, kind="adapter",
                created_at=utcnow(), status="pending", uri=None, content_hash=None,
                recipe="sft", dataset_id=None, metrics={}, gate={}, model_uri=None,
                updated_at=utcnow(),
            )
        )  # fmt: skip
        return store.set_candidate_status(S, made.id, status, expected="pending")

    live, retired = canary("canary"), canary("rolled_back")
    rejected = canary("rejected")  # never served: its id names no release that served
    on_head, on_live, on_retired, stray = (
        record(S, rel) for rel in (head.id, live.id, retired.id, rejected.id)
    )
    store.add_records([on_head, on_live, on_retired, stray])
    for rec in (on_head, on_live, on_retired, stray):
        store.add_report(report(S, rec.id, score=1.0))

    exp = collect(store, S, "scored", recipe="sft", max_staleness=0)
    assert exp.dropped == Counter(unknown_release=1)
    served = {s.record_ids[0]: (s.release_id, s.staleness) for s in exp.samples}
    assert served == {
        on_head.id: (head.id, 0),
        on_live.id: (live.id, 0),
        on_retired.id: (retired.id, 0),
    }
    assert base not in {release for release, _ in served.values()}


def test_consumed_records_are_not_consumed_again(store: SQLStore) -> None:
    base = _base(store)
    a, b, c = (record(S, base) for _ in range(3))
    store.add_records([a, b, c])
    store.add_report(report(S, a.id))
    store.add_report(report(S, b.id))

    exp = collect(store, S, "scored", recipe="sft")
    assert len(exp.samples) == 2 and exp.awaiting_feedback == 1
    assert consume(store, S, "sft", exp.samples, "batch-1") == 2
    assert consume(store, S, "sft", exp.samples, "batch-1-retry") == 2  # idempotent

    store.add_report(report(S, a.id, score=0.0))  # late feedback on a consumed record
    store.add_report(report(S, c.id, score=0.5))
    again = collect(store, S, "scored", recipe="sft")
    assert [s.record_ids for s in again.samples] == [(c.id,)]
    assert again.dropped == Counter(consumed=2)
    assert again.awaiting_feedback == 0
    # another recipe has consumed nothing
    assert len(collect(store, S, "scored", recipe="kto").samples) == 3


def test_token_mismatch_and_missing_ids_are_counted(store: SQLStore) -> None:
    base = _base(store)
    broken = session(S, base, 3, break_at=2)
    good = session(S, base, 2)
    plain = record(S, base, prompt_token_ids=None, completion_token_ids=None, logprobs=None)
    store.add_records([*broken, *good, plain])
    store.add_report(report(S, *(r.id for r in broken)))
    store.add_report(report(S, *(r.id for r in good)))
    store.add_report(report(S, plain.id))
    store.add_report(report(S, good[0].id, score=None, feedback="too long"))

    traj = collect(store, S, "trajectory", recipe="harness")
    assert traj.dropped == Counter(token_mismatch=1, no_score=1)
    assert sorted(len(s.record_ids) for s in traj.samples) == [1, 2]

    ro = collect(store, S, "rollout", recipe="grpo")
    assert ro.dropped == Counter(token_mismatch=1, no_token_ids=1, no_score=1)
    assert len(ro.samples) == 1


def test_preference_pairs_answers_to_the_same_prompt(store: SQLStore) -> None:
    base = _base(store)
    best, worst, middle = (
        record(S, base, answer=f"answer {k}", prompt="Name a color.") for k in range(3)
    )
    other = record(S, base, prompt="Something else.")
    store.add_records([best, worst, middle, other])
    for rec, score in ((best, 1.0), (worst, -1.0), (middle, 0.0), (other, 1.0)):
        store.add_report(report(S, rec.id, score=score))

    exp = collect(store, S, "preference", recipe="dpo")
    (pair,) = exp.samples
    assert isinstance(pair, PreferenceSample)
    assert pair.record_ids == (best.id, worst.id)
    assert (pair.chosen, pair.rejected) == ("answer 0", "answer 1")
    assert (pair.chosen_score, pair.rejected_score) == (1.0, -1.0)
    assert exp.dropped == Counter(unpaired=2)


def test_anthropic_records_are_normalized(store: SQLStore) -> None:
    base = _base(store)
    rec = record(
        S,
        base,
        route="messages",
        request={
            "model": "tiny",
            "max_tokens": 16,
            "system": "Be brief.",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        },
        response={"type": "message", "content": [{"type": "text", "text": "Hello."}]},
    )
    store.add_records([rec])
    store.add_report(report(S, rec.id, score=1.0))
    (s,) = collect(store, S, "scored", recipe="sft").samples
    assert isinstance(s, ScoredSample)
    assert s.messages == (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    )
    assert s.completion == "Hello."


def test_readiness_has_no_side_effects(store: SQLStore, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from reef.artifacts import LocalArtifacts
    from reef.datasets import materialize

    base = _base(store)
    recs = [record(S, base) for _ in range(5)]
    store.add_records(recs)
    for rec in recs[:3]:
        store.add_report(report(S, rec.id))
    artifacts = LocalArtifacts(tmp_path / "artifacts")
    loop = LoopSettings(batch_size=4)

    before = readiness(store, S, loop, artifacts=artifacts)
    assert (before.eligible, before.batch_size, before.ready) == (3, 4, False)
    assert before.awaiting_feedback == 2 and before.last_materialization is None
    assert readiness(store, S, loop, artifacts=artifacts) == before
    assert store.consumed_record_ids(S, "sft") == set()
    assert not (tmp_path / "artifacts").exists()

    snap = materialize(collect(store, S, "scored", recipe="sft"), "scored", artifacts)
    after = readiness(store, S, loop, artifacts=artifacts)
    assert after.last_materialization is not None
    assert after.last_materialization["content_hash"] == snap.content_hash
    assert after.last_materialization["rows"] == 3


def test_a_slice_keeps_the_samples_whose_every_record_carries_its_tags(store: SQLStore) -> None:
    """`reef.select.tags`: one role of a multi-agent app learns from its own turns only; a
    trajectory with one turn of another role is not its sample; readiness counts the slice."""
    base = _base(store)
    planner = [record(S, base, tags={"role": "planner", "app": "a"}) for _ in range(3)]
    executor = [record(S, base, tags={"role": "executor"}) for _ in range(2)]
    untagged = record(S, base)
    mixed = session(S, base, 2)
    mixed = [
        dataclasses.replace(mixed[0], tags={"role": "planner"}),
        dataclasses.replace(mixed[1], tags={"role": "executor"}),
    ]
    waiting = record(S, base, tags={"role": "planner"})  # never reported
    store.add_records([*planner, *executor, untagged, *mixed, waiting])
    for rec in [*planner, *executor, untagged]:
        store.add_report(report(S, rec.id))
    store.add_report(report(S, *(r.id for r in mixed)))

    whole = collect(store, S, "scored", recipe="sft")
    assert len(whole.samples) == 7 and whole.awaiting_feedback == 1

    mine = collect(store, S, "scored", recipe="sft", select=Slice({"role": "planner"}))
    assert sorted(s.record_ids[0] for s in mine.samples) == sorted(r.id for r in planner)
    assert mine.dropped == Counter(not_selected=4)  # 2 executor turns, untagged, the mix
    assert mine.awaiting_feedback == 1
    narrower = collect(
        store, S, "scored", recipe="sft", select=Slice({"role": "planner", "app": "b"})
    )
    assert not narrower.samples and narrower.awaiting_feedback == 0

    loop = LoopSettings(batch_size=3, select={"tags": {"role": "planner"}})
    ready = readiness(store, S, loop)
    assert (ready.eligible, ready.ready, ready.dropped["not_selected"]) == (3, True, 4)
    other = readiness(store, S, LoopSettings(batch_size=3, select={"tags": {"role": "executor"}}))
    assert (other.eligible, other.ready, other.awaiting_feedback) == (2, False, 0)


def test_a_slice_by_session_or_user_keeps_that_agents_or_users_turns(store: SQLStore) -> None:
    """`reef.select.sessions` / `.users`: one agent's run (its session) or one end user's turns
    (x-reef-user-id, recorded as the tag reef.user) is the training slice; a trajectory with a
    turn outside it is not its sample; readiness and awaiting_feedback count the slice."""
    base = _base(store)
    run = session(S, base, 2)  # one agent's run: a two-turn trajectory and a single turn
    alone = record(S, base, session_id=run[0].session_id, turn=5)
    other = session(S, base, 1)
    alice = [record(S, base, tags={USER_TAG: "alice"}) for _ in range(2)]
    bob = record(S, base, tags={USER_TAG: "bob", "role": "planner"})
    waiting = [  # never reported: what awaits feedback in each slice
        record(S, base, session_id=run[0].session_id, turn=9),
        record(S, base, tags={USER_TAG: "alice"}),
    ]
    store.add_records([*run, alone, *other, *alice, bob, *waiting])
    store.add_report(report(S, *(r.id for r in run)))
    for rec in [alone, *other, *alice, bob]:
        store.add_report(report(S, rec.id))

    mine = collect(store, S, "scored", recipe="sft", select=Slice(sessions=(run[0].session_id,)))
    assert sorted(s.record_ids for s in mine.samples) == sorted(
        [tuple(r.id for r in run), (alone.id,)]
    )
    assert mine.dropped == Counter(not_selected=4) and mine.awaiting_feedback == 1
    users = collect(store, S, "scored", recipe="sft", select=Slice(users=("alice",)))
    assert sorted(s.record_ids[0] for s in users.samples) == sorted(r.id for r in alice)
    assert users.awaiting_feedback == 1
    both = Slice({"role": "planner"}, users=("alice", "bob"))  # every key must hold
    assert [
        s.record_ids[0] for s in collect(store, S, "scored", recipe="sft", select=both).samples
    ] == [bob.id]

    loop = LoopSettings(batch_size=2, select={"sessions": [run[0].session_id]})
    ready = readiness(store, S, loop)
    assert (ready.eligible, ready.ready, ready.dropped["not_selected"]) == (2, True, 4)
    bobs = readiness(store, S, LoopSettings(batch_size=2, select={"users": ["bob"]}))
    assert (bobs.eligible, bobs.ready, bobs.awaiting_feedback) == (1, False, 0)


def test_a_named_metric_is_what_the_recipe_learns_from(store: SQLStore) -> None:
    """reef.metric: a sample's score is the counted report's named metric (true 1, false 0, a
    float as it is); reports without it are dropped as no_<metric>; a person's metric wins over
    a judgment that gives none, and the rule picks among several."""
    base = _base(store)
    recs = [record(S, base) for _ in range(4)]
    store.add_records(recs)
    t0 = utcnow()
    store.add_report(report(S, recs[0].id, score=None, metrics={"helpful": True}))
    store.add_report(report(S, recs[1].id, score=0.2, metrics={"helpful": False, "accuracy": 0.4}))
    store.add_report(report(S, recs[2].id, score=1.0))  # no helpful: dropped under it
    judged = report(S, recs[3].id, score=1.0, created_at=t0, metadata={"source": "judge"})
    person = report(S, recs[3].id, score=None, created_at=t0, metrics={"accuracy": 0.9})
    later = report(
        S, recs[3].id, score=None, created_at=t0 + timedelta(seconds=1), metrics={"accuracy": 0.5}
    )
    for rep in (judged, person, later):
        store.add_report(rep)

    helpful = collect(store, S, "scored", recipe="kto", metric="helpful")
    assert {s.record_ids[0]: s.score for s in helpful.samples} == {recs[0].id: 1.0, recs[1].id: 0.0}
    assert helpful.dropped == Counter({"no_helpful": 2})
    accuracy = collect(store, S, "scored", recipe="kto", metric="accuracy")
    scores = {s.record_ids[0]: s.score for s in accuracy.samples}
    assert scores == {recs[1].id: 0.4, recs[3].id: 0.5}  # the latest person's, not the judge's
    first = collect(store, S, "scored", recipe="kto", metric="accuracy", rule="first")
    assert {s.record_ids[0]: s.score for s in first.samples}[recs[3].id] == 0.9
    # the default metric is the score, as before
    plain = collect(store, S, "scored", recipe="kto")
    assert {s.record_ids[0]: s.score for s in plain.samples}[recs[3].id] == 1.0  # only the judge's
    # readiness counts what the loop's metric gives
    ready = readiness(store, S, LoopSettings(batch_size=2, metric="helpful"))
    assert (ready.eligible, ready.ready) == (2, True)
    assert ready.dropped["no_helpful"] == 2
