"""ScenarioStore's contract on every backend: a scenario is created with its base release,
once, whoever races for it; deleting one removes everything of it and leaves a tombstone
that holds the name until its files are gone."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import pytest

from reef.errors import Conflict, NotFound
from reef.records import Consumption, Record, Scenario, utcnow
from reef.store import tables
from reef.store.scenarios import ScenarioStore
from reef.store.sql import SQLStore, open_store
from tests.store.builders import count_rows, new_candidate, new_release, new_report

MakeRecord = Callable[..., Record]


def _base(store: SQLStore, name: str = "exp") -> str:
    return store.create_scenario(name).head_release_id


def test_create_scenario_makes_base_release_and_head(
    scenario_store: ScenarioStore, store: SQLStore
) -> None:
    created = scenario_store.create_scenario("support", description="help desk")
    assert created.created_at.tzinfo is not None
    assert created.created_at.utcoffset() == timedelta(0)

    got = scenario_store.get_scenario("support")
    assert got == created
    assert got.description == "help desk"

    (base,) = store.list_releases("support")
    assert base.id == got.head_release_id
    assert base.id.startswith("rel_")
    assert (base.seq, base.kind, base.parent_id, base.uri, base.metadata) == (
        0,
        "base",
        None,
        None,
        {},
    )
    assert store.get_release("support", base.id) == base


def test_create_existing_scenario_conflicts(scenario_store: ScenarioStore, store: SQLStore) -> None:
    scenario_store.create_scenario("dup")
    with pytest.raises(Conflict, match="scenario 'dup' already exists"):
        scenario_store.create_scenario("dup")
    assert len(store.list_releases("dup")) == 1


def test_ensure_scenario_creates_once(scenario_store: ScenarioStore, store: SQLStore) -> None:
    first = scenario_store.ensure_scenario("auto")
    again = scenario_store.ensure_scenario("auto")
    assert again == first
    assert len(store.list_releases("auto")) == 1
    explicit = scenario_store.create_scenario("explicit", description="d")
    assert scenario_store.ensure_scenario("explicit") == explicit


def test_list_scenarios(scenario_store: ScenarioStore, store: SQLStore) -> None:
    assert scenario_store.list_scenarios() == []
    b = scenario_store.create_scenario("b")
    a = scenario_store.create_scenario("a")
    assert scenario_store.list_scenarios() == [a, b]


def test_concurrent_ensure_scenario_creates_one_scenario_and_one_base(
    scenario_store: ScenarioStore, store: SQLStore
) -> None:
    n = 8
    barrier = threading.Barrier(n)
    results: list[Scenario | Exception | None] = [None] * n

    def ensure(i: int) -> None:
        barrier.wait()
        try:
            results[i] = scenario_store.ensure_scenario("raced")
        except Exception as e:  # surfaced by the asserts below
            results[i] = e

    threads = [threading.Thread(target=ensure, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert not [r for r in results if isinstance(r, Exception)], results
    heads = {r.head_release_id for r in results if isinstance(r, Scenario)}
    assert len(heads) == 1
    assert [s.name for s in scenario_store.list_scenarios()] == ["raced"]
    (base,) = store.list_releases("raced")
    assert base.id in heads
    assert count_rows(store, tables.releases, "raced") == 1


def test_concurrent_ensure_scenario_across_stores(database_url: str) -> None:
    # Separate engines stand in for separate processes: no shared pool or lock in Python.
    stores = [open_store(database_url) for _ in range(4)]
    stores[0].migrate()
    barrier = threading.Barrier(len(stores))
    heads: list[str] = []

    def ensure(s: SQLStore) -> None:
        barrier.wait()
        heads.append(s.ensure_scenario("shared").head_release_id)

    threads = [threading.Thread(target=ensure, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert len(heads) == len(stores)
        assert len(set(heads)) == 1
        assert len(stores[0].list_releases("shared")) == 1
    finally:
        for s in stores:
            s.close()


def test_missing_scenario_is_not_found(scenario_store: ScenarioStore, store: SQLStore) -> None:
    for call in (
        lambda: scenario_store.get_scenario("ghost"),
        lambda: scenario_store.delete_scenario("ghost"),
        lambda: store.list_records("ghost"),
        lambda: store.list_reports("ghost"),
        lambda: store.list_releases("ghost"),
        lambda: store.existing_record_ids("ghost", ["rec_x"]),
        lambda: store.get_record("ghost", "rec_x"),
    ):
        with pytest.raises(NotFound, match="scenario 'ghost' not found"):
            call()


def test_delete_scenario_cascades(
    scenario_store: ScenarioStore, store: SQLStore, make_record: MakeRecord
) -> None:
    doomed = scenario_store.create_scenario("doomed")
    kept = scenario_store.create_scenario("kept")
    doomed_records = [make_record("doomed", doomed.head_release_id) for _ in range(3)]
    kept_records = [make_record("kept", kept.head_release_id) for _ in range(2)]
    store.add_records(doomed_records + kept_records)
    store.add_report(new_report("doomed", (doomed_records[0].id,)))
    kept_report, _ = store.add_report(new_report("kept", (kept_records[0].id,)))

    scenario_store.delete_scenario("doomed")

    with pytest.raises(NotFound):
        scenario_store.get_scenario("doomed")
    for table in (tables.records, tables.reports, tables.releases):
        assert count_rows(store, table, "doomed") == 0
    assert store.list_records("kept") == sorted(kept_records, key=lambda r: r.id)
    assert store.list_reports("kept") == [kept_report]
    assert len(store.list_releases("kept")) == 1

    # Once its files are gone too (reef.deletion drops the tombstone), the name is free
    # again, with a fresh chain.
    scenario_store.finish_deletion("doomed")
    reborn = scenario_store.create_scenario("doomed")
    assert reborn.head_release_id != doomed.head_release_id
    assert store.list_records("doomed") == []


def test_delete_scenario_removes_candidates_and_releases(
    scenario_store: ScenarioStore, store: SQLStore
) -> None:
    doomed = scenario_store.create_scenario("doomed")
    kept = scenario_store.create_scenario("kept")
    head = store.publish_release(new_release("doomed", doomed.head_release_id))
    store.add_candidate(new_candidate("doomed", doomed.head_release_id, status="superseded"))
    store.add_candidate(new_candidate("doomed", head.id))
    kept_candidate = store.add_candidate(new_candidate("kept", kept.head_release_id))

    scenario_store.delete_scenario("doomed")
    for table in (tables.candidates, tables.releases):
        assert count_rows(store, table, "doomed") == 0
    assert store.list_candidates("kept") == [kept_candidate]

    # Once its files are gone too (the tombstone dropped), the name is free again, with a
    # fresh chain and no candidates.
    scenario_store.finish_deletion("doomed")
    reborn = scenario_store.create_scenario("doomed")
    assert store.list_candidates("doomed") == []
    assert [r.id for r in store.list_releases("doomed")] == [reborn.head_release_id]


def test_delete_scenario_removes_consumptions(
    scenario_store: ScenarioStore, store: SQLStore, make_record: MakeRecord
) -> None:
    release = _base(store)
    record = make_record("exp", release)
    store.add_records([record])
    store.add_consumptions([Consumption("exp", "sft", record.id, "b1", utcnow())])
    scenario_store.delete_scenario("exp")
    scenario_store.finish_deletion("exp")  # its files are gone too: the name is free again
    scenario_store.create_scenario("exp")
    assert store.consumed_record_ids("exp", "sft") == set()


def test_deleting_leaves_a_tombstone_that_holds_the_name(
    scenario_store: ScenarioStore, store: SQLStore, make_record: MakeRecord
) -> None:
    base = scenario_store.ensure_scenario("gone").head_release_id
    scenario_store.ensure_scenario("kept")
    store.add_records([make_record("gone", base)])
    assert scenario_store.pending_deletions() == []

    scenario_store.delete_scenario("gone")
    (tomb,) = scenario_store.pending_deletions()
    assert tomb.scenario == "gone" and tomb.deleted_at.tzinfo is not None
    with pytest.raises(NotFound):
        scenario_store.get_scenario("gone")
    with pytest.raises(NotFound):
        scenario_store.delete_scenario(
            "gone"
        )  # twice: not found, and the tombstone stays as it was
    assert scenario_store.pending_deletions() == [tomb]

    for create in (scenario_store.ensure_scenario, scenario_store.create_scenario):
        with pytest.raises(Conflict) as e:
            create("gone")
        assert e.value.code == "scenario_deleting"
    assert [s.name for s in scenario_store.list_scenarios()] == ["kept"]

    scenario_store.finish_deletion("gone")
    scenario_store.finish_deletion("gone")  # idempotent
    assert scenario_store.pending_deletions() == []
    again = scenario_store.ensure_scenario("gone")
    assert store.list_records("gone") == [] and len(store.list_releases("gone")) == 1
    assert again.head_release_id != base


def test_pending_deletions_oldest_first(scenario_store: ScenarioStore, store: SQLStore) -> None:
    for name in ("b", "a", "c"):
        scenario_store.ensure_scenario(name)
        scenario_store.delete_scenario(name)
    assert [d.scenario for d in scenario_store.pending_deletions()] == ["b", "a", "c"]
