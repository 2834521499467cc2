"""The database's life (Lifecycle) on every backend: migrations idempotent, safe when
processes start at once, in step with tables.py, and keeping the data of every older revision;
a database that does not answer fails cleanly."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import insert, inspect, text
from sqlmodel import SQLModel

from reef.errors import SessionTurnTaken, StoreError
from reef.records import Record, new_id, utcnow
from reef.store import tables
from reef.store.sql import MIGRATIONS, SQLStore, open_store
from tests.store.builders import alembic_step, new_job, new_release, new_report, upgrade_to


def test_migration_creates_exactly_the_tables(store: SQLStore) -> None:
    names = set(inspect(store.engine).get_table_names())
    assert names == {
        "alembic_version",
        "scenarios",
        "releases",
        "records",
        "reports",
        "consumptions",
        "candidates",
        "jobs",
        "scenario_deletions",
        "report_references",
        "ui_sessions",
        "shadow_records",
        "engines",
        "quota_counters",
        "event_deliveries",
        "scenario_settings",
        "review_items",
    }
    for table in (
        tables.scenarios,
        tables.releases,
        tables.records,
        tables.reports,
        tables.consumptions,
        tables.candidates,
    ):
        columns = {c["name"] for c in inspect(store.engine).get_columns(table.name)}
        assert columns == set(table.columns.keys()), table.name


def test_migration_matches_the_declared_tables(store: SQLStore) -> None:
    # What `alembic revision --autogenerate` would emit: nothing, or a migration is missing.
    with store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), SQLModel.metadata)
    assert diff == []


def test_migrate_is_idempotent(store: SQLStore) -> None:
    store.create_scenario("kept")
    store.migrate()
    store.migrate()
    assert [s.name for s in store.list_scenarios()] == ["kept"]


def _migrate_at_once(url: str, n: int = 4) -> list[BaseException]:
    stores = [open_store(url) for _ in range(n)]
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def migrate(s: SQLStore) -> None:
        barrier.wait()
        try:
            s.migrate()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=migrate, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stores[0].create_scenario("after")
    for s in stores:
        s.close()
    return errors


def test_concurrent_first_migrations_sqlite(tmp_path: Path) -> None:
    assert _migrate_at_once(f"sqlite:///{tmp_path / 'fresh.db'}") == []


@pytest.mark.postgres
def test_concurrent_first_migrations_postgres(make_postgres_database: Callable[[], str]) -> None:
    assert _migrate_at_once(make_postgres_database()) == []


def test_migration_0012_moves_duplicate_session_turns_to_forks(
    database_url: str, make_record: Callable[..., Record]
) -> None:
    """Two replicas that raced before 0012 left two records at one turn of a session: the
    first keeps it, the later one becomes a fork (a session of its own, its parent kept)."""
    old = open_store(database_url)
    try:
        upgrade_to(old, "0011")
        release = old.create_scenario("raced").head_release_id
        first = make_record("raced", release, session_id="ses_1", turn=0)
        twins = [
            make_record("raced", release, session_id="ses_1", turn=1, parent_id=first.id)
            for _ in range(2)
        ]
        won, lost = sorted(twins, key=lambda r: r.id)  # the earlier id keeps the turn
        old.add_records([first, *twins])
    finally:
        old.close()

    store = open_store(database_url)
    try:
        store.migrate()
        kept = {r.id: r for r in store.list_records("raced")}
        assert (kept[won.id].session_id, kept[won.id].turn) == ("ses_1", 1)
        assert kept[lost.id].session_id == f"ses_{lost.id}"
        assert (kept[lost.id].turn, kept[lost.id].parent_id) == (1, first.id)
        with pytest.raises(SessionTurnTaken):
            store.add_records([make_record("raced", release, session_id="ses_1", turn=1)])
    finally:
        store.close()


def test_migrate_twice_and_ping(store: SQLStore) -> None:
    store.create_scenario("kept")
    store.migrate()
    store.migrate()
    assert store.ping() is True
    assert [s.name for s in store.list_scenarios()] == ["kept"]


@pytest.mark.postgres
def test_unreachable_database_fails_cleanly() -> None:
    store = open_store("postgresql+psycopg://root@127.0.0.1:1/reef", connect_timeout_s=2)
    try:
        assert store.ping() is False
        with pytest.raises(StoreError, match="database error while reading scenario 'x'"):
            store.get_scenario("x")
        with pytest.raises(StoreError, match="adding 2 records"):
            store.add_records([_record_stub("a"), _record_stub("b")])
    finally:
        store.close()


def _record_stub(suffix: str) -> Record:
    return Record(
        id=new_id("rec") + suffix,
        scenario="x",
        created_at=utcnow(),
        route="chat.completions",
        model="m",
        stream=False,
        request={},
        response={},
        release_id="rel_x",
    )


def test_migration_0005_keeps_reports_and_idempotency_keys(database_url: str) -> None:
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import insert

    old = open_store(database_url)
    try:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with old.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, "0004")
        now = utcnow()
        with old.engine.begin() as conn:
            for name in ("a", "b"):
                conn.execute(
                    insert(tables.scenarios).values(
                        name=name, created_at=now, head_release_id=f"rel_{name}"
                    )
                )
                conn.execute(
                    insert(tables.releases).values(
                        id=f"rel_{name}",
                        scenario=name,
                        seq=0,
                        kind="base",
                        created_at=now,
                        metadata={},
                    )
                )
            conn.execute(
                insert(tables.records).values(
                    id="rec_1",
                    scenario="a",
                    created_at=now,
                    route="chat.completions",
                    model="m",
                    stream=False,
                    request={"messages": []},
                    response={},
                    release_id="rel_a",
                    timings={},
                    tags={},
                    idempotency_key="k",
                )
            )
            conn.execute(
                insert(tables.reports).values(
                    id="judge-1",
                    scenario="a",
                    created_at=now,
                    references=["rec_1"],
                    score=1.0,
                    metadata={},
                    content_hash="0" * 64,
                )
            )
    finally:
        old.close()
    store = open_store(database_url)
    try:
        store.migrate()
        assert [r.id for r in store.list_reports("a")] == ["judge-1"]
        assert store.find_idempotent("a", "chat.completions", "k") is not None
        assert store.find_idempotent("a", "messages", "k") is None
        mine = new_report("b", ("rec_x",), id="judge-1")
        assert store.add_report(mine) == (mine, True)
    finally:
        store.close()


def test_migration_0002_keeps_records_of_0001(database_url: str) -> None:
    old = open_store(database_url)
    try:
        upgrade_to(old, "0001")
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


def test_upgrade_keeps_older_releases_as_creations(database_url: str) -> None:
    s = open_store(database_url)
    try:
        alembic_step(s, command.upgrade, "0002")
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
        published = s.publish_release(new_release("old", "rel_old"))
        assert published.seq == 1

        # And back: 0003's columns and table go, the chain stays.
        alembic_step(s, command.downgrade, "0002")
        assert "candidates" not in inspect(s.engine).get_table_names()
        columns = {c["name"] for c in inspect(s.engine).get_columns("releases")}
        assert "operation" not in columns
        s.migrate()
        assert [r.id for r in s.list_releases("old")] == ["rel_old", published.id]
    finally:
        s.close()


def test_migration_0004_up_and_down(database_url: str) -> None:
    s = open_store(database_url)
    try:
        alembic_step(s, command.upgrade, "0003")
        scen = "m4"
        with s.engine.begin() as conn:  # a scenario and a candidate written before 0004
            conn.execute(
                text(
                    "INSERT INTO scenarios (name, created_at, head_release_id) "
                    "VALUES (:s, '2025-01-01 00:00:00', 'rel_m4')"
                ),
                {"s": scen},
            )
            conn.execute(
                text(
                    "INSERT INTO releases (id, scenario, seq, parent_id, kind, created_at, uri, "
                    "metadata) VALUES ('rel_m4', :s, 0, NULL, 'base', '2025-01-01 00:00:00', "
                    "NULL, '{}')"
                ),
                {"s": scen},
            )
            conn.execute(
                text(
                    "INSERT INTO candidates (id, scenario, parent_id, kind, created_at, status, "
                    "metrics, gate, updated_at) VALUES ('rel_c4', :s, 'rel_m4', 'adapter', "
                    "'2025-01-01 00:00:00', 'pending', '{}', '{}', '2025-01-01 00:00:00')"
                ),
                {"s": scen},
            )
        s.migrate()
        old = s.get_candidate(scen, "rel_c4")
        assert (old.operation, old.metadata) == ("training", {})
        s.add_job(new_job(scen))

        alembic_step(s, command.downgrade, "0003")
        assert "jobs" not in inspect(s.engine).get_table_names()
        columns = {c["name"] for c in inspect(s.engine).get_columns("candidates")}
        assert "operation" not in columns and "metadata" not in columns
        s.migrate()
        assert s.get_candidate(scen, "rel_c4").status == "pending"
    finally:
        s.close()
