"""The release chain's compare-and-swap and the candidates table, on every backend."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import Table, func, inspect, select, text

from reef.errors import BadRequest, Conflict, HeadMoved, NotFound
from reef.records import Candidate, Release, new_id, utcnow
from reef.store import tables
from reef.store.sql import MIGRATIONS, SQLStore, open_store


def _count(store: SQLStore, table: Table, scenario: str) -> int:
    with store.engine.connect() as conn:
        query = select(func.count()).select_from(table).where(table.c.scenario == scenario)
        return conn.execute(query).scalar_one()


def _release(scenario: str, parent_id: str | None, **fields: Any) -> Release:
    values: dict[str, Any] = {
        "id": new_id("rel"),
        "scenario": scenario,
        "seq": 99,  # ignored: the store numbers the chain
        "parent_id": parent_id,
        "kind": "adapter",
        "created_at": utcnow() - timedelta(days=1),  # ignored too: stamped at publishing
        "uri": "s3://reef/support/adapters/1",
        "metadata": {"lora_rank": 16},
        "operation": "training",
        "content_hash": "ab" * 32,
        "recipe": "sft",
        "dataset_id": "ds_1",
        "metrics": {"eval_loss": 0.42, "win_rate": 0.61},
        "gate": {"decision": "accept", "delta": 0.04, "threshold": 0.02},
        "model_uri": "models:/reef-support/3",
    }
    values.update(fields)
    return Release(**values)


def _candidate(scenario: str, parent_id: str, **fields: Any) -> Candidate:
    now = utcnow()
    values: dict[str, Any] = {
        "id": new_id("rel"),
        "scenario": scenario,
        "parent_id": parent_id,
        "kind": "adapter",
        "created_at": now,
        "status": "pending",
        "uri": "s3://reef/support/candidates/1",
        "content_hash": "cd" * 32,
        "recipe": "sft",
        "dataset_id": "ds_1",
        "metrics": {"eval_loss": 0.5},
        "gate": {},
        "model_uri": None,
        "updated_at": now,
    }
    values.update(fields)
    return Candidate(**values)


# releases -----------------------------------------------------------------------
def test_base_release_is_a_creation_with_empty_fields(store: SQLStore) -> None:
    sc = store.create_scenario("support")
    base = store.head_release("support")
    assert base.id == sc.head_release_id
    assert (base.seq, base.parent_id, base.operation) == (0, None, "creation")
    assert (base.content_hash, base.recipe, base.dataset_id, base.model_uri) == (None,) * 4
    assert (base.metrics, base.gate) == ({}, {})
    assert store.list_releases("support") == [base]


def test_publish_moves_head_and_numbers_the_chain(store: SQLStore) -> None:
    sc = store.create_scenario("support")
    before = utcnow()
    wanted = _release("support", sc.head_release_id)
    published = store.publish_release(wanted)

    assert published.seq == 1
    assert published.created_at >= before
    assert published.created_at.utcoffset() == timedelta(0)
    assert published == Release(**{**wanted.__dict__, "seq": 1, "created_at": published.created_at})
    assert store.get_scenario("support").head_release_id == published.id
    assert store.head_release("support") == published
    assert store.get_release("support", published.id) == published
    assert [r.id for r in store.list_releases("support")] == [sc.head_release_id, published.id]


def test_a_chain_of_publishes_is_linear(store: SQLStore) -> None:
    sc = store.create_scenario("support")
    parent = sc.head_release_id
    operations = ["training", "training", "rollback", "promote", "training"]
    for op in operations:
        parent = store.publish_release(_release("support", parent, operation=op)).id
    chain = store.list_releases("support")
    assert [r.seq for r in chain] == list(range(len(operations) + 1))
    assert [r.operation for r in chain] == ["creation", *operations]
    assert [r.parent_id for r in chain] == [None] + [r.id for r in chain[:-1]]
    assert [r.created_at for r in chain] == sorted(r.created_at for r in chain)
    assert store.head_release("support") == chain[-1]
    assert chain[-1].id == parent


def test_stale_parent_raises_head_moved_and_writes_nothing(store: SQLStore) -> None:
    sc = store.create_scenario("support")
    base = sc.head_release_id
    first = store.publish_release(_release("support", base))
    chain = store.list_releases("support")

    stale = _release("support", base)
    with pytest.raises(HeadMoved, match=f"is release '{first.id}', not '{base}'") as info:
        store.publish_release(stale)
    assert (info.value.status, info.value.code) == (409, "head_moved")
    assert isinstance(info.value, Conflict)
    assert store.list_releases("support") == chain
    assert store.get_scenario("support").head_release_id == first.id
    with pytest.raises(NotFound):
        store.get_release("support", stale.id)

    # A parent from another scenario, or no release at all, is just as stale.
    other = store.create_scenario("other")
    with pytest.raises(HeadMoved):
        store.publish_release(_release("support", other.head_release_id))
    with pytest.raises(HeadMoved):
        store.publish_release(_release("support", "rel_nope"))
    assert store.list_releases("support") == chain


def test_publish_rejects_what_cannot_join_a_chain(store: SQLStore) -> None:
    sc = store.create_scenario("support")
    with pytest.raises(BadRequest, match="no parent_id"):
        store.publish_release(_release("support", None))
    with pytest.raises(BadRequest, match="operation 'creation'"):
        store.publish_release(_release("support", sc.head_release_id, operation="creation"))
    with pytest.raises(BadRequest, match="operation 'retrain'"):
        store.publish_release(_release("support", sc.head_release_id, operation="retrain"))
    with pytest.raises(NotFound, match="scenario 'ghost' not found"):
        store.publish_release(_release("ghost", sc.head_release_id))
    with pytest.raises(NotFound, match="scenario 'ghost' not found"):
        store.head_release("ghost")
    assert len(store.list_releases("support")) == 1


def test_publishing_a_taken_release_id_conflicts(store: SQLStore) -> None:
    sc = store.create_scenario("support")
    first = store.publish_release(_release("support", sc.head_release_id))
    with pytest.raises(Conflict, match=f"release id '{first.id}' already exists") as info:
        store.publish_release(_release("support", first.id, id=first.id))
    assert not isinstance(info.value, HeadMoved)
    with pytest.raises(Conflict, match="already exists"):
        store.publish_release(_release("support", first.id, id=sc.head_release_id))
    assert store.head_release("support") == first
    assert len(store.list_releases("support")) == 2


def _publish_at_once(stores: list[SQLStore], scenario: str, parent: str) -> list[Any]:
    """Each store in its own thread publishes on `parent` at the same moment."""
    barrier = threading.Barrier(len(stores))
    results: list[Any] = [None] * len(stores)

    def publish(i: int) -> None:
        barrier.wait()
        try:
            results[i] = stores[i].publish_release(_release(scenario, parent))
        except BaseException as e:
            results[i] = e

    threads = [threading.Thread(target=publish, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _assert_one_winner(store: SQLStore, results: list[Any], base: str) -> None:
    won = [r for r in results if isinstance(r, Release)]
    lost = [r for r in results if isinstance(r, HeadMoved)]
    assert len(won) == 1, results
    assert len(lost) == len(results) - 1, [r for r in results if not isinstance(r, Release)]
    chain = store.list_releases("raced")
    assert [(r.seq, r.parent_id) for r in chain] == [(0, None), (1, base)]
    assert chain[1] == won[0]
    assert store.head_release("raced") == won[0]


def test_concurrent_publishers_one_wins(store: SQLStore) -> None:
    base = store.create_scenario("raced").head_release_id
    results = _publish_at_once([store] * 32, "raced", base)
    _assert_one_winner(store, results, base)


def test_concurrent_publishers_on_separate_engines_one_wins(database_url: str) -> None:
    # Separate engines stand in for separate processes (API replicas, training workers).
    stores = [open_store(database_url) for _ in range(8)]
    try:
        stores[0].migrate()
        base = stores[0].create_scenario("raced").head_release_id
        results = _publish_at_once(stores, "raced", base)
        _assert_one_winner(stores[0], results, base)
    finally:
        for s in stores:
            s.close()


# candidates -----------------------------------------------------------------------
def test_candidate_add_get_list(store: SQLStore) -> None:
    sc = store.create_scenario("support")
    first = store.add_candidate(_candidate("support", sc.head_release_id))
    assert store.get_candidate("support", first.id) == first
    assert first.created_at.utcoffset() == timedelta(0)
    second = store.add_candidate(
        _candidate(
            "support",
            sc.head_release_id,
            created_at=first.created_at + timedelta(seconds=1),
            status="rejected",
            gate={"decision": "reject", "delta": -0.1},
            message="worse than the head",
        )
    )
    assert store.get_candidate("support", second.id) == second
    assert store.list_candidates("support") == [second, first]
    assert store.list_candidates("support", status="pending") == [first]
    assert store.list_candidates("support", status="published") == []

    store.create_scenario("empty")
    assert store.list_candidates("empty") == []


def test_candidate_errors(store: SQLStore) -> None:
    sc = store.create_scenario("support")
    c = store.add_candidate(_candidate("support", sc.head_release_id))
    with pytest.raises(Conflict, match=f"candidate '{c.id}' already exists"):
        store.add_candidate(_candidate("support", sc.head_release_id, id=c.id))
    with pytest.raises(Conflict, match="already a release's id"):
        store.add_candidate(_candidate("support", sc.head_release_id, id=sc.head_release_id))
    with pytest.raises(NotFound, match="release 'rel_nope' not found in scenario 'support'"):
        store.add_candidate(_candidate("support", "rel_nope"))
    other = store.create_scenario("other")
    with pytest.raises(NotFound, match="not found in scenario 'support'"):
        store.add_candidate(_candidate("support", other.head_release_id))
    with pytest.raises(BadRequest, match="unknown candidate status 'maybe'"):
        store.add_candidate(_candidate("support", sc.head_release_id, status="maybe"))
    with pytest.raises(NotFound, match="scenario 'ghost' not found"):
        store.add_candidate(_candidate("ghost", sc.head_release_id))
    with pytest.raises(NotFound, match="candidate 'rel_nope' not found in scenario 'support'"):
        store.get_candidate("support", "rel_nope")
    with pytest.raises(NotFound, match="scenario 'ghost' not found"):
        store.get_candidate("ghost", c.id)
    with pytest.raises(NotFound, match="scenario 'ghost' not found"):
        store.list_candidates("ghost")
    with pytest.raises(NotFound, match="candidate 'rel_nope' not found"):
        store.set_candidate_status("support", "rel_nope", "failed")
    with pytest.raises(NotFound, match="scenario 'ghost' not found"):
        store.set_candidate_status("ghost", c.id, "failed")
    with pytest.raises(BadRequest, match="unknown candidate status"):
        store.set_candidate_status("support", c.id, "done")
    assert store.list_candidates("support") == [c]


def test_candidate_status_compare_and_swap(store: SQLStore) -> None:
    sc = store.create_scenario("support")
    c = store.add_candidate(_candidate("support", sc.head_release_id))

    gate = {"decision": "accept", "delta": 0.04}
    published = store.set_candidate_status(
        "support", c.id, "published", expected="pending", gate=gate, model_uri="models:/m/1"
    )
    assert (published.status, published.gate, published.model_uri) == (
        "published",
        gate,
        "models:/m/1",
    )
    assert published.updated_at > c.updated_at
    assert (published.created_at, published.metrics, published.message) == (
        c.created_at,
        c.metrics,
        None,
    )
    assert store.get_candidate("support", c.id) == published

    with pytest.raises(Conflict, match="is 'published', not 'pending'") as info:
        store.set_candidate_status("support", c.id, "rejected", expected="pending")
    assert info.value.code == "candidate_status"
    assert store.get_candidate("support", c.id) == published

    # Without `expected`, an unconditional move; None leaves the other fields as they were.
    failed = store.set_candidate_status("support", c.id, "failed", message="upload broke")
    assert (failed.status, failed.message, failed.gate, failed.model_uri) == (
        "failed",
        "upload broke",
        gate,
        "models:/m/1",
    )


def test_concurrent_candidate_status_swaps_one_wins(store: SQLStore) -> None:
    sc = store.create_scenario("support")
    c = store.add_candidate(_candidate("support", sc.head_release_id))
    n = 16
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def swap(i: int) -> None:
        barrier.wait()
        try:
            results[i] = store.set_candidate_status(
                "support", c.id, "published", expected="pending", message=f"worker {i}"
            )
        except BaseException as e:
            results[i] = e

    threads = [threading.Thread(target=swap, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [r for r in results if isinstance(r, Candidate)]
    lost = [r for r in results if isinstance(r, Conflict) and r.code == "candidate_status"]
    assert (len(won), len(lost)) == (1, n - 1), results
    assert store.get_candidate("support", c.id) == won[0]


def test_delete_scenario_removes_candidates_and_releases(store: SQLStore) -> None:
    doomed = store.create_scenario("doomed")
    kept = store.create_scenario("kept")
    head = store.publish_release(_release("doomed", doomed.head_release_id))
    store.add_candidate(_candidate("doomed", doomed.head_release_id, status="superseded"))
    store.add_candidate(_candidate("doomed", head.id))
    kept_candidate = store.add_candidate(_candidate("kept", kept.head_release_id))

    store.delete_scenario("doomed")
    for table in (tables.candidates, tables.releases):
        assert _count(store, table, "doomed") == 0
    assert store.list_candidates("kept") == [kept_candidate]

    # Once its files are gone too (the tombstone dropped), the name is free again, with a
    # fresh chain and no candidates.
    store.finish_deletion("doomed")
    reborn = store.create_scenario("doomed")
    assert store.list_candidates("doomed") == []
    assert [r.id for r in store.list_releases("doomed")] == [reborn.head_release_id]


# migration 0003 -------------------------------------------------------------------
def _alembic(store: SQLStore, step: Any, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with store.engine.connect() as conn:
        conn.execution_options(reef_write=True)
        with conn.begin():
            config.attributes["connection"] = conn
            step(config, revision)


def test_upgrade_keeps_older_releases_as_creations(database_url: str) -> None:
    s = open_store(database_url)
    try:
        _alembic(s, command.upgrade, "0002")
        with s.engine.begin() as conn:  # a scenario written by a Reef before 0003
            conn.execute(
                text(
                    "INSERT INTO scenarios (name, created_at, head_release_id) "
                    "VALUES ('old', '2025-01-01 00:00:00', 'rel_old')"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO releases (id, scenario, seq, parent_id, kind, created_at, "
                    "uri, metadata) VALUES ('rel_old', 'old', 0, NULL, 'base', "
                    "'2025-01-01 00:00:00', NULL, '{}')"
                )
            )
        s.migrate()
        (base,) = s.list_releases("old")
        assert (base.id, base.operation, base.metrics, base.gate) == ("rel_old", "creation", {}, {})
        published = s.publish_release(_release("old", "rel_old"))
        assert published.seq == 1

        # And back: 0003's columns and table go, the chain stays.
        _alembic(s, command.downgrade, "0002")
        assert "candidates" not in inspect(s.engine).get_table_names()
        columns = {c["name"] for c in inspect(s.engine).get_columns("releases")}
        assert "operation" not in columns
        s.migrate()
        assert [r.id for r in s.list_releases("old")] == ["rel_old", published.id]
    finally:
        s.close()
