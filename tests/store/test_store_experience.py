"""The Store contract for the experience stream: sessions, idempotency keys, consumption
receipts, and migration 0002 over a database with data in it (SQLite and Postgres)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import insert, inspect

from reef.errors import Conflict, IdempotencyKeyReused, NotFound
from reef.records import Consumption, Record, new_id, utcnow
from reef.store import tables
from reef.store.sql import MIGRATIONS, SQLStore, open_store

MakeRecord = Callable[..., Record]


def _scenario(store: SQLStore, name: str = "exp") -> str:
    return store.create_scenario(name).head_release_id


def test_session_fields_round_trip(store: SQLStore, make_record: MakeRecord) -> None:
    release = _scenario(store)
    parent = make_record("exp", release, session_id="ses_1", turn=0, state_hash="a" * 64)
    child = make_record(
        "exp",
        release,
        session_id="ses_1",
        turn=1,
        parent_id=parent.id,
        state_hash="b" * 64,
        idempotency_key="key-1",
    )
    plain = make_record("exp", release)
    store.add_records([parent, child, plain])
    assert store.get_record("exp", child.id) == child
    assert store.get_record("exp", plain.id) == plain
    assert (plain.session_id, plain.turn, plain.parent_id, plain.idempotency_key) == (None,) * 4
    assert store.list_records("exp") == sorted([parent, child, plain], key=lambda r: r.id)


def test_find_session_parent_picks_the_longest(store: SQLStore, make_record: MakeRecord) -> None:
    release = _scenario(store)
    t0 = utcnow()
    short = make_record("exp", release, turn=0, state_hash="1" * 64, created_at=t0)
    long_new = make_record(
        "exp", release, turn=1, state_hash="2" * 64, created_at=t0 + timedelta(seconds=2)
    )
    long_old = make_record(
        "exp", release, turn=1, state_hash="2" * 64, created_at=t0 + timedelta(seconds=1)
    )
    store.add_records([short, long_new, long_old])
    # Hashes come longest conversation first; equal states (two users asked the same and got
    # the same answer) go to the newest record not continued yet.
    assert store.find_session_parent("exp", ["2" * 64, "1" * 64]) == long_new
    store.add_records([make_record("exp", release, turn=2, parent_id=long_new.id)])
    assert store.find_session_parent("exp", ["2" * 64, "1" * 64]) == long_old
    store.add_records([make_record("exp", release, turn=2, parent_id=long_old.id)])
    assert store.find_session_parent("exp", ["2" * 64, "1" * 64]) == long_new
    assert store.find_session_parent("exp", ["9" * 64, "1" * 64]) == short
    assert store.find_session_parent("exp", ["9" * 64]) is None
    assert store.find_session_parent("exp", []) is None
    store.create_scenario("other")
    assert store.find_session_parent("other", ["1" * 64]) is None


def test_session_tail_and_children(store: SQLStore, make_record: MakeRecord) -> None:
    release = _scenario(store)
    r0 = make_record("exp", release, session_id="ses_a", turn=0)
    r1 = make_record("exp", release, session_id="ses_a", turn=1, parent_id=r0.id)
    r2 = make_record("exp", release, session_id="ses_a", turn=2, parent_id=r1.id)
    fork = make_record("exp", release, session_id="ses_b", turn=1, parent_id=r0.id)
    store.add_records([r2, r0, fork, r1])
    assert store.session_tail("exp", "ses_a") == r2
    assert store.session_tail("exp", "ses_b") == fork
    assert store.session_tail("exp", "ses_none") is None
    assert store.has_children("exp", r0.id)
    assert store.has_children("exp", r1.id)
    assert not store.has_children("exp", r2.id)
    assert not store.has_children("exp", fork.id)
    store.create_scenario("other")
    assert store.session_tail("other", "ses_a") is None
    assert not store.has_children("other", r0.id)


def test_idempotency_key_is_unique_per_scenario(store: SQLStore, make_record: MakeRecord) -> None:
    one = _scenario(store, "one")
    two = _scenario(store, "two")
    first = make_record("one", one, idempotency_key="k")
    store.add_records([first])
    assert store.find_idempotent("one", "chat.completions", "k") == first
    assert store.find_idempotent("one", "chat.completions", "other") is None
    assert store.find_idempotent("two", "chat.completions", "k") is None

    with pytest.raises(IdempotencyKeyReused, match="already used by record"):
        store.add_records([make_record("one", one, idempotency_key="k")])
    assert isinstance(IdempotencyKeyReused("x"), Conflict)
    # Same key in another scenario, and any number of records without a key: no clash.
    store.add_records([make_record("two", two, idempotency_key="k")])
    store.add_records([make_record("one", one) for _ in range(3)])
    assert len(store.list_records("one")) == 4


def test_consumptions_are_idempotent_and_scoped_by_recipe(
    store: SQLStore, make_record: MakeRecord
) -> None:
    release = _scenario(store)
    a, b = make_record("exp", release), make_record("exp", release)
    store.add_records([a, b])
    now = utcnow()
    store.add_consumptions([Consumption("exp", "sft", a.id, "batch-1", now)])
    store.add_consumptions(
        [
            Consumption("exp", "sft", a.id, "batch-2", now),  # already consumed: kept as is
            Consumption("exp", "sft", b.id, "batch-2", now),
            Consumption("exp", "dpo", a.id, "batch-3", now),
        ]
    )
    store.add_consumptions([])
    assert store.consumed_record_ids("exp", "sft") == {a.id, b.id}
    assert store.consumed_record_ids("exp", "dpo") == {a.id}
    assert store.consumed_record_ids("exp", "grpo") == set()
    with store.engine.connect() as conn:
        t = tables.consumptions
        batch = conn.execute(t.select().where(t.c.recipe == "sft", t.c.record_id == a.id)).one()
    assert batch.batch_id == "batch-1"

    with pytest.raises(NotFound, match="scenario 'nope'"):
        store.add_consumptions([Consumption("nope", "sft", a.id, "b", now)])


def test_delete_scenario_removes_consumptions(store: SQLStore, make_record: MakeRecord) -> None:
    release = _scenario(store)
    record = make_record("exp", release)
    store.add_records([record])
    store.add_consumptions([Consumption("exp", "sft", record.id, "b1", utcnow())])
    store.delete_scenario("exp")
    store.finish_deletion("exp")  # its files are gone too: the name is free again
    store.create_scenario("exp")
    assert store.consumed_record_ids("exp", "sft") == set()


def _alembic_to(store: SQLStore, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def test_migration_0002_keeps_records_of_0001(database_url: str) -> None:
    old = open_store(database_url)
    try:
        _alembic_to(old, "0001")
        columns = {c["name"] for c in inspect(old.engine).get_columns("records")}
        assert "session_id" not in columns
        now = utcnow()
        release_id, record_id = new_id("rel"), new_id("rec")
        with old.engine.begin() as conn:
            conn.execute(
                insert(tables.scenarios).values(
                    name="legacy", description=None, created_at=now, head_release_id=release_id
                )
            )
            conn.execute(
                insert(tables.releases).values(
                    id=release_id,
                    scenario="legacy",
                    seq=0,
                    parent_id=None,
                    kind="base",
                    created_at=now,
                    metadata={},
                )
            )
            # Only the columns 0001 has.
            conn.execute(
                insert(tables.records).values(
                    id=record_id,
                    scenario="legacy",
                    created_at=now,
                    route="chat.completions",
                    model="m",
                    stream=False,
                    request={"messages": [{"role": "user", "content": "hi"}]},
                    response={"choices": []},
                    release_id=release_id,
                    timings={},
                    tags={},
                )
            )
    finally:
        old.close()

    store = open_store(database_url)
    try:
        store.migrate()
        record = store.get_record("legacy", record_id)
        assert record.request == {"messages": [{"role": "user", "content": "hi"}]}
        assert (record.session_id, record.turn, record.parent_id) == (None, None, None)
        assert (record.state_hash, record.idempotency_key) == (None, None)
        assert store.consumed_record_ids("legacy", "sft") == set()
        assert store.find_idempotent("legacy", "chat.completions", "k") is None
    finally:
        store.close()
