"""The Store contract, run against every backend (SQLite and Postgres)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import Table, func, select

from reef.errors import BadRequest, Conflict, IdempotencyKeyReused, NotFound, StoreError
from reef.records import Record, Report, Scenario, new_id, utcnow
from reef.store import tables
from reef.store.sql import SQLStore, open_store

MakeRecord = Callable[..., Record]


def _count(store: SQLStore, table: Table, scenario: str) -> int:
    with store.engine.connect() as conn:
        query = select(func.count()).select_from(table).where(table.c.scenario == scenario)
        return conn.execute(query).scalar_one()


def _report(scenario: str, refs: tuple[str, ...], **fields: object) -> Report:
    values: dict[str, object] = {
        "id": new_id("rep"),
        "scenario": scenario,
        "created_at": utcnow(),
        "references": refs,
        "score": 0.75,
        "feedback": {"text": "too long", "labels": ["verbose"]},
        "metadata": {"judge": "human"},
    }
    values.update(fields)
    return Report(**values)  # type: ignore[arg-type]


# scenarios ----------------------------------------------------------------------
def test_create_scenario_makes_base_release_and_head(store: SQLStore) -> None:
    created = store.create_scenario("support", description="help desk")
    assert created.created_at.tzinfo is not None
    assert created.created_at.utcoffset() == timedelta(0)

    got = store.get_scenario("support")
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


def test_create_existing_scenario_conflicts(store: SQLStore) -> None:
    store.create_scenario("dup")
    with pytest.raises(Conflict, match="scenario 'dup' already exists"):
        store.create_scenario("dup")
    assert len(store.list_releases("dup")) == 1


def test_ensure_scenario_creates_once(store: SQLStore) -> None:
    first = store.ensure_scenario("auto")
    again = store.ensure_scenario("auto")
    assert again == first
    assert len(store.list_releases("auto")) == 1
    explicit = store.create_scenario("explicit", description="d")
    assert store.ensure_scenario("explicit") == explicit


def test_list_scenarios(store: SQLStore) -> None:
    assert store.list_scenarios() == []
    b = store.create_scenario("b")
    a = store.create_scenario("a")
    assert store.list_scenarios() == [a, b]


def test_concurrent_ensure_scenario_creates_one_scenario_and_one_base(store: SQLStore) -> None:
    n = 8
    barrier = threading.Barrier(n)
    results: list[Scenario | Exception | None] = [None] * n

    def ensure(i: int) -> None:
        barrier.wait()
        try:
            results[i] = store.ensure_scenario("raced")
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
    assert [s.name for s in store.list_scenarios()] == ["raced"]
    (base,) = store.list_releases("raced")
    assert base.id in heads
    assert _count(store, tables.releases, "raced") == 1


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


def test_missing_scenario_is_not_found(store: SQLStore) -> None:
    for call in (
        lambda: store.get_scenario("ghost"),
        lambda: store.delete_scenario("ghost"),
        lambda: store.list_records("ghost"),
        lambda: store.list_reports("ghost"),
        lambda: store.list_releases("ghost"),
        lambda: store.existing_record_ids("ghost", ["rec_x"]),
        lambda: store.get_record("ghost", "rec_x"),
    ):
        with pytest.raises(NotFound, match="scenario 'ghost' not found"):
            call()


def test_delete_scenario_cascades(store: SQLStore, make_record: MakeRecord) -> None:
    doomed = store.create_scenario("doomed")
    kept = store.create_scenario("kept")
    doomed_records = [make_record("doomed", doomed.head_release_id) for _ in range(3)]
    kept_records = [make_record("kept", kept.head_release_id) for _ in range(2)]
    store.add_records(doomed_records + kept_records)
    store.add_report(_report("doomed", (doomed_records[0].id,)))
    kept_report, _ = store.add_report(_report("kept", (kept_records[0].id,)))

    store.delete_scenario("doomed")

    with pytest.raises(NotFound):
        store.get_scenario("doomed")
    for table in (tables.records, tables.reports, tables.releases):
        assert _count(store, table, "doomed") == 0
    assert store.list_records("kept") == sorted(kept_records, key=lambda r: r.id)
    assert store.list_reports("kept") == [kept_report]
    assert len(store.list_releases("kept")) == 1

    # Once its files are gone too (reef.deletion drops the tombstone), the name is free
    # again, with a fresh chain.
    store.finish_deletion("doomed")
    reborn = store.create_scenario("doomed")
    assert reborn.head_release_id != doomed.head_release_id
    assert store.list_records("doomed") == []


# records ------------------------------------------------------------------------
def test_records_round_trip_exactly(store: SQLStore, make_record: MakeRecord) -> None:
    sc = store.create_scenario("rt")
    plus_two = timezone(timedelta(hours=2))
    request = {
        # Key order is part of the body (chat templates render tool schemas in it).
        "model": "smollm2",
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "parameters": {"type": "object", "properties": {"zeta": {}, "alpha": {}}},
                },
            }
        ],
        "messages": [{"role": "user", "content": 'héllo ✓ \u0000 "quoted" \n newline'}],
        "temperature": 0.1,
        "nested": {"deep": [[1, 2.5, None, True, False, {"x": []}]]},
    }
    full = make_record(
        "rt",
        sc.head_release_id,
        created_at=datetime(2025, 3, 4, 5, 6, 7, 891234, tzinfo=plus_two),
        route="messages",
        stream=True,
        request=request,
        response={"content": [{"type": "text", "text": "ok"}], "usage": {"input_tokens": 3}},
        prompt_token_ids=[0, 1, 2**31 - 1, 2**40, 151_643],
        completion_token_ids=list(range(300)),
        logprobs=[-0.1, -1e-300, -123.456789012345, 0.0, -2.5e-7],
        timings={"ttft_s": 0.0123456789, "total_s": 1.5},
        tags={"user": "ü", "env": "test"},
    )
    bare = make_record(
        "rt",
        sc.head_release_id,
        prompt_token_ids=None,
        completion_token_ids=None,
        logprobs=None,
        timings={},
        tags={},
    )
    store.add_records([full, bare])

    got = store.get_record("rt", full.id)
    assert got == full
    assert got.created_at == datetime(2025, 3, 4, 3, 6, 7, 891234, tzinfo=UTC)
    assert got.created_at.utcoffset() == timedelta(0)
    assert list(got.request) == list(request)
    assert list(got.request["tools"][0]["function"]["parameters"]["properties"]) == [
        "zeta",
        "alpha",
    ]
    assert all(type(x) is int for x in got.prompt_token_ids or [])
    assert all(type(x) is float for x in got.logprobs or [])
    assert got.stream is True

    got_bare = store.get_record("rt", bare.id)
    assert got_bare == bare
    assert got_bare.prompt_token_ids is None and got_bare.logprobs is None


def test_list_records_paginates_in_id_order(store: SQLStore, make_record: MakeRecord) -> None:
    a = store.create_scenario("a")
    b = store.create_scenario("b")
    ours = [make_record("a", a.head_release_id) for _ in range(25)]
    theirs = [make_record("b", b.head_release_id) for _ in range(5)]
    store.add_records(ours[:12] + theirs + ours[12:])
    expected = sorted(ours, key=lambda r: r.id)

    pages: list[list[Record]] = []
    after = None
    while True:
        page = store.list_records("a", after=after, limit=10)
        if not page:
            break
        pages.append(page)
        after = page[-1].id
    assert [len(p) for p in pages] == [10, 10, 5]
    assert [r for p in pages for r in p] == expected

    assert store.list_records("a") == expected
    assert store.list_records("a", after=expected[-1].id) == []
    assert store.list_records("a", after=expected[4].id, limit=3) == expected[5:8]
    assert store.list_records("a", limit=0) == []
    assert store.list_records("b") == sorted(theirs, key=lambda r: r.id)


def test_existing_record_ids_is_scoped_to_the_scenario(
    store: SQLStore, make_record: MakeRecord
) -> None:
    a = store.create_scenario("a")
    b = store.create_scenario("b")
    ra = make_record("a", a.head_release_id)
    rb = make_record("b", b.head_release_id)
    store.add_records([ra, rb])

    assert store.existing_record_ids("a", [ra.id, rb.id, "rec_nope"]) == {ra.id}
    assert store.existing_record_ids("b", iter([ra.id, rb.id, rb.id])) == {rb.id}
    assert store.existing_record_ids("a", []) == set()
    many = [new_id("rec") for _ in range(1200)] + [ra.id]
    assert store.existing_record_ids("a", many) == {ra.id}


def test_get_record_not_found_names_record_and_scenario(
    store: SQLStore, make_record: MakeRecord
) -> None:
    a = store.create_scenario("a")
    store.create_scenario("b")
    r = make_record("a", a.head_release_id)
    store.add_records([r])
    with pytest.raises(NotFound, match=f"record '{r.id}' not found in scenario 'b'"):
        store.get_record("b", r.id)
    with pytest.raises(NotFound, match="record 'rec_missing' not found in scenario 'a'"):
        store.get_record("a", "rec_missing")


def test_a_clashing_batch_writes_nothing(store: SQLStore, make_record: MakeRecord) -> None:
    sc = store.create_scenario("a")
    first = make_record("a", sc.head_release_id)
    store.add_records([first])

    fresh = [make_record("a", sc.head_release_id) for _ in range(3)]
    with pytest.raises(Conflict, match=f"record id '{first.id}' already exists"):
        store.add_records([*fresh, first])
    with pytest.raises(NotFound, match="scenario 'ghost' not found"):
        store.add_records([*fresh, make_record("ghost", sc.head_release_id)])
    with pytest.raises(Conflict, match="twice"):
        store.add_records([fresh[0], fresh[0]])
    with pytest.raises(BadRequest, match="cannot store"):
        store.add_records([*fresh, make_record("a", sc.head_release_id, request={"x": object()})])
    assert store.existing_record_ids("a", [r.id for r in fresh]) == set()
    assert store.list_records("a") == [first]


# reports ------------------------------------------------------------------------
def test_report_round_trip_and_idempotency(store: SQLStore, make_record: MakeRecord) -> None:
    sc = store.create_scenario("a")
    r = make_record("a", sc.head_release_id)
    store.add_records([r])
    report = _report("a", (r.id, "rec_other"))

    stored, created = store.add_report(report)
    assert created is True
    assert stored == report
    assert store.get_report("a", report.id) == report

    # A retry (same id, same content, even a later timestamp) returns the stored one.
    retry = _report(
        "a", report.references, id=report.id, created_at=utcnow() + timedelta(seconds=5)
    )
    again, created = store.add_report(retry)
    assert created is False
    assert again == report

    changed = _report("a", report.references, id=report.id, score=0.0)
    with pytest.raises(
        Conflict, match=f"report_id {report.id} already exists with different content"
    ):
        store.add_report(changed)

    text_report = _report("a", (r.id,), feedback="plain text", score=None, metadata={})
    store.add_report(text_report)
    assert store.get_report("a", text_report.id) == text_report
    assert store.list_reports("a") == sorted([report, text_report], key=lambda x: x.id)
    assert store.list_reports("a", after=min(report.id, text_report.id), limit=5) == [
        max([report, text_report], key=lambda x: x.id)
    ]


def test_report_ids_are_scoped_by_scenario(store: SQLStore) -> None:
    # another scenario's report_id neither blocks this one's nor shows through it
    store.create_scenario("a")
    store.create_scenario("b")
    theirs = _report("a", ("rec_a",), id="judge-1", feedback="a's secret")
    ours = _report("b", ("rec_b",), id="judge-1", score=0.0, feedback="b's")
    assert store.add_report(theirs) == (theirs, True)
    assert store.add_report(ours) == (ours, True)
    assert store.add_report(ours) == (ours, False)  # a retry in b is b's
    assert store.get_report("a", "judge-1") == theirs
    assert store.get_report("b", "judge-1") == ours
    assert store.list_reports("b") == [ours]
    with pytest.raises(Conflict) as e:
        store.add_report(_report("b", ("rec_b",), id="judge-1", score=1.0))
    assert "a's secret" not in e.value.message and "'a'" not in e.value.message
    store.delete_scenario("a")
    assert store.get_report("b", "judge-1") == ours
    with pytest.raises(NotFound, match="scenario 'ghost' not found"):
        store.add_report(_report("ghost", ("rec_x",), id="judge-1"))


def test_idempotency_keys_are_scoped_by_route(store: SQLStore, make_record: MakeRecord) -> None:
    # the same key on /v1/chat/completions and on /v1/messages names two requests
    head = store.create_scenario("a").head_release_id
    chat = make_record("a", head, idempotency_key="k", route="chat.completions")
    messages = make_record("a", head, idempotency_key="k", route="messages")
    store.add_records([chat])
    assert store.find_idempotent("a", "messages", "k") is None
    store.add_records([messages])
    assert store.find_idempotent("a", "chat.completions", "k") == chat
    assert store.find_idempotent("a", "messages", "k") == messages
    with pytest.raises(IdempotencyKeyReused, match=f"record '{messages.id}'"):
        store.add_records([make_record("a", head, idempotency_key="k", route="messages")])
    with pytest.raises(IdempotencyKeyReused, match="twice in one batch"):
        store.add_records(
            [make_record("a", head, idempotency_key="j", route="messages") for _ in range(2)]
        )
    both = [make_record("a", head, idempotency_key="j", route=r) for r in ("messages", "x")]
    store.add_records(both)
    assert len(store.list_records("a")) == 4


NUL = "nul:\x00:end"


def test_nul_characters_round_trip(store: SQLStore, make_record: MakeRecord) -> None:
    # Postgres text and JSONB hold no NUL (\u0000); what a client sent is stored as sent anyway
    head = store.create_scenario("a").head_release_id
    record = make_record(
        "a",
        head,
        request={
            "model": "m",
            "messages": [{"role": "user", "content": NUL, NUL: [NUL, {"k": NUL}]}],
            "stop": ["\x00"],
        },
        response={"choices": [{"message": {"role": "assistant", "content": NUL}}]},
        tags={"client": NUL},
        timings={NUL: 1.0},
    )
    store.add_records([record])
    assert store.get_record("a", record.id) == record
    report = _report(
        "a", (record.id,), feedback={"correction": NUL, NUL: NUL}, metadata={"note": NUL}
    )
    assert store.add_report(report) == (report, True)
    assert store.add_report(report) == (report, False)  # a retry still compares equal
    assert store.get_report("a", report.id) == report
    text = _report("a", (record.id,), feedback=NUL, metadata={})
    store.add_report(text)
    assert store.list_reports("a") == sorted([report, text], key=lambda r: r.id)
    # values that look like the store's own escape come back as they were, too
    lookalike = make_record(
        "a",
        head,
        request={"$reef.nul": "x"},
        response={"$reef.nul": NUL},
        tags={"$reef.nul": "[1]"},
    )
    store.add_records([lookalike])
    assert store.get_record("a", lookalike.id) == lookalike


def test_report_not_found_cases(store: SQLStore) -> None:
    store.create_scenario("a")
    with pytest.raises(NotFound, match="report 'rep_nope' not found in scenario 'a'"):
        store.get_report("a", "rep_nope")
    with pytest.raises(NotFound, match="scenario 'ghost' not found"):
        store.add_report(_report("ghost", ("rec_x",)))
    with pytest.raises(NotFound, match="release 'rel_nope' not found in scenario 'a'"):
        store.get_release("a", "rel_nope")


def test_concurrent_identical_reports_create_once(store: SQLStore) -> None:
    store.create_scenario("a")
    report = _report("a", ("rec_x",))
    n = 6
    barrier = threading.Barrier(n)
    created: list[bool] = []

    def add() -> None:
        barrier.wait()
        created.append(store.add_report(report)[1])

    threads = [threading.Thread(target=add) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(created) == [False] * (n - 1) + [True]
    assert store.list_reports("a") == [report]


# lifecycle ----------------------------------------------------------------------
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

    from reef.store.sql import MIGRATIONS

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
        mine = _report("b", ("rec_x",), id="judge-1")
        assert store.add_report(mine) == (mine, True)
    finally:
        store.close()
