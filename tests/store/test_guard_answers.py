"""Guard answers in the store (reef.guard_answers), on SQLite and on Postgres: a candidate's
answers a gate guard failed are kept once as records tagged reef.guard and queued with reason
guard; they are not traffic (the calls per hour, the per-release scores and a rollout's arms
leave them out), and a reviewer's correction of one is a training target as any correction is.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from reef.experience import collect, correction
from reef.guard_answers import GuardAnswer, failed, keep
from reef.records import (
    GUARD_CANDIDATE_TAG,
    GUARD_EXPECTED_TAG,
    GUARD_RELEASE,
    GUARD_SCORE_TAG,
    GUARD_TAG,
    GUARD_TASK_TAG,
    Candidate,
    Record,
    Report,
    new_id,
    utcnow,
)
from reef.store.browse import Browse
from reef.store.sql import SQLStore
from tests.store.builders import new_candidate


def _candidate(scenario: str, parent: str) -> Candidate:
    return new_candidate(scenario, parent, status="rejected")


def _ask(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}]


def _answers() -> list[GuardAnswer]:
    tasks = [
        ("egypt", _ask("Capital of Egypt?"), {"answer": "Cairo"}),
        ("insect", _ask("Legs of an insect?"), {"answer": ["six", "6"]}),
        ("free", _ask("Say something."), {}),
    ]
    return failed("facts", tasks, ["Paris.", "Six legs.", "Hm"], [0.0, 1.0, 0.5])


def _report(scenario: str, record_id: str, score: float, fix: str | None = None) -> Report:
    return Report(
        id=new_id("rpt"),
        scenario=scenario,
        created_at=utcnow(),
        references=(record_id,),
        score=score,
        feedback={"correction": fix} if fix else None,
        metadata={"source": "human", "reviewer": "rita"},
    )


def test_failed_answers_are_kept_once_and_queued(store: SQLStore) -> None:
    head = store.ensure_scenario("g").head_release_id
    answers = _answers()
    assert [(a.task_id, a.score) for a in answers] == [("egypt", 0.0), ("free", 0.5)]
    first = _candidate("g", head)
    ids = keep(store, first, answers)
    egypt = store.get_record("g", ids[0])
    assert egypt.release_id == head and egypt.model == first.id
    assert egypt.request["messages"] == _ask("Capital of Egypt?")
    assert egypt.response["choices"][0]["message"]["content"] == "Paris."
    assert egypt.tags == {
        GUARD_TAG: "facts",
        GUARD_CANDIDATE_TAG: first.id,
        GUARD_TASK_TAG: "egypt",
        GUARD_SCORE_TAG: "0",
        GUARD_EXPECTED_TAG: "Cairo",
    }
    assert GUARD_EXPECTED_TAG not in store.get_record("g", ids[1]).tags  # the task names none
    items = store.review_items("g", None, 10)
    assert [(i.record_id, i.reason) for i in items] == [(ids[0], "guard"), (ids[1], "guard")]
    # a later candidate failing the same task with the same words adds nothing; a new wrong
    # answer is a new item
    again = keep(
        store,
        _candidate("g", head),
        [
            *answers,
            *failed(
                "facts",
                [("egypt", _ask("Capital of Egypt?"), {"answer": "Cairo"})],
                ["Alexandria."],
                [0.0],
            ),
        ],
    )
    assert again[:2] == ids and again[2] not in ids
    assert [i.record_id for i in store.review_items("g", None, 10)] == again
    assert store.get_record("g", ids[0]).tags[GUARD_CANDIDATE_TAG] == first.id


def test_guard_answers_are_not_traffic_but_their_corrections_train(
    store: SQLStore, make_record: Callable[..., Record]
) -> None:
    head = store.ensure_scenario("g").head_release_id
    served = make_record("g", head)
    store.add_records([served])
    guard_id = keep(store, _candidate("g", head), _answers())[0]
    store.add_report(_report("g", served.id, 1.0))
    store.add_report(_report("g", guard_id, 0.0, "Cairo."))
    browse = Browse(store)
    traffic = browse.traffic("g")
    assert (traffic.records, traffic.quoted, traffic.mean_score) == (1, 1, 1.0)
    scores = browse.release_scores("g")
    assert scores[head].n == 1 and scores[head].mean == 1.0  # the reviewer's 0 is no release's
    assert scores[GUARD_RELEASE].n == 1
    since = utcnow() - timedelta(hours=1)
    assert store.arm_sums("g", head, since, 0.0, 1.0) == (1, 1.0)  # a rollout's arm: served only
    exp = collect(store, "g", "scored", recipe="sft")
    targets = {s.record_ids[0]: correction(s.feedback) for s in exp.samples}
    assert targets == {served.id: None, guard_id: "Cairo."}
