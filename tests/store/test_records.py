"""RecordStore's contract on every backend: records round-trip exactly, batches are all or
nothing, reads go by id, sessions are stitched by parent links, and an Idempotency-Key names
one record per scenario and route."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import pytest

from reef.errors import BadRequest, Conflict, IdempotencyKeyReused, NotFound
from reef.records import Record, new_id, utcnow
from reef.store.records import RecordStore
from reef.store.sessions import SessionStore
from reef.store.sql import SQLStore
from tests.store.builders import new_report

MakeRecord = Callable[..., Record]


def _base(store: SQLStore, name: str = "exp") -> str:
    return store.create_scenario(name).head_release_id


def test_records_round_trip_exactly(
    record_store: RecordStore, store: SQLStore, make_record: MakeRecord
) -> None:
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
    record_store.add_records([full, bare])

    got = record_store.get_record("rt", full.id)
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

    got_bare = record_store.get_record("rt", bare.id)
    assert got_bare == bare
    assert got_bare.prompt_token_ids is None and got_bare.logprobs is None


def test_list_records_paginates_in_id_order(
    record_store: RecordStore, store: SQLStore, make_record: MakeRecord
) -> None:
    a = store.create_scenario("a")
    b = store.create_scenario("b")
    ours = [make_record("a", a.head_release_id) for _ in range(25)]
    theirs = [make_record("b", b.head_release_id) for _ in range(5)]
    record_store.add_records(ours[:12] + theirs + ours[12:])
    expected = sorted(ours, key=lambda r: r.id)

    pages: list[list[Record]] = []
    after = None
    while True:
        page = record_store.list_records("a", after=after, limit=10)
        if not page:
            break
        pages.append(page)
        after = page[-1].id
    assert [len(p) for p in pages] == [10, 10, 5]
    assert [r for p in pages for r in p] == expected

    assert record_store.list_records("a") == expected
    assert record_store.list_records("a", after=expected[-1].id) == []
    assert record_store.list_records("a", after=expected[4].id, limit=3) == expected[5:8]
    assert record_store.list_records("a", limit=0) == []
    assert record_store.list_records("b") == sorted(theirs, key=lambda r: r.id)


def test_existing_record_ids_is_scoped_to_the_scenario(
    record_store: RecordStore, store: SQLStore, make_record: MakeRecord
) -> None:
    a = store.create_scenario("a")
    b = store.create_scenario("b")
    ra = make_record("a", a.head_release_id)
    rb = make_record("b", b.head_release_id)
    record_store.add_records([ra, rb])

    assert record_store.existing_record_ids("a", [ra.id, rb.id, "rec_nope"]) == {ra.id}
    assert record_store.existing_record_ids("b", iter([ra.id, rb.id, rb.id])) == {rb.id}
    assert record_store.existing_record_ids("a", []) == set()
    many = [new_id("rec") for _ in range(1200)] + [ra.id]
    assert record_store.existing_record_ids("a", many) == {ra.id}


def test_get_record_not_found_names_record_and_scenario(
    record_store: RecordStore, store: SQLStore, make_record: MakeRecord
) -> None:
    a = store.create_scenario("a")
    store.create_scenario("b")
    r = make_record("a", a.head_release_id)
    record_store.add_records([r])
    with pytest.raises(NotFound, match=f"record '{r.id}' not found in scenario 'b'"):
        record_store.get_record("b", r.id)
    with pytest.raises(NotFound, match="record 'rec_missing' not found in scenario 'a'"):
        record_store.get_record("a", "rec_missing")


def test_a_clashing_batch_writes_nothing(
    record_store: RecordStore, store: SQLStore, make_record: MakeRecord
) -> None:
    sc = store.create_scenario("a")
    first = make_record("a", sc.head_release_id)
    record_store.add_records([first])

    fresh = [make_record("a", sc.head_release_id) for _ in range(3)]
    with pytest.raises(Conflict, match=f"record id '{first.id}' already exists"):
        record_store.add_records([*fresh, first])
    with pytest.raises(NotFound, match="scenario 'ghost' not found"):
        record_store.add_records([*fresh, make_record("ghost", sc.head_release_id)])
    with pytest.raises(Conflict, match="twice"):
        record_store.add_records([fresh[0], fresh[0]])
    with pytest.raises(BadRequest, match="cannot store"):
        record_store.add_records(
            [*fresh, make_record("a", sc.head_release_id, request={"x": object()})]
        )
    assert record_store.existing_record_ids("a", [r.id for r in fresh]) == set()
    assert record_store.list_records("a") == [first]


def test_idempotency_keys_are_scoped_by_route(
    record_store: RecordStore, store: SQLStore, make_record: MakeRecord
) -> None:
    # the same key on /v1/chat/completions and on /v1/messages names two requests
    head = store.create_scenario("a").head_release_id
    chat = make_record("a", head, idempotency_key="k", route="chat.completions")
    messages = make_record("a", head, idempotency_key="k", route="messages")
    record_store.add_records([chat])
    assert record_store.find_idempotent("a", "messages", "k") is None
    record_store.add_records([messages])
    assert record_store.find_idempotent("a", "chat.completions", "k") == chat
    assert record_store.find_idempotent("a", "messages", "k") == messages
    with pytest.raises(IdempotencyKeyReused, match=f"record '{messages.id}'"):
        record_store.add_records([make_record("a", head, idempotency_key="k", route="messages")])
    with pytest.raises(IdempotencyKeyReused, match="twice in one batch"):
        record_store.add_records(
            [make_record("a", head, idempotency_key="j", route="messages") for _ in range(2)]
        )
    both = [make_record("a", head, idempotency_key="j", route=r) for r in ("messages", "x")]
    record_store.add_records(both)
    assert len(record_store.list_records("a")) == 4


NUL = "nul:\x00:end"


def test_nul_characters_round_trip(
    record_store: RecordStore, store: SQLStore, make_record: MakeRecord
) -> None:
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
    record_store.add_records([record])
    assert record_store.get_record("a", record.id) == record
    report = new_report(
        "a", (record.id,), feedback={"correction": NUL, NUL: NUL}, metadata={"note": NUL}
    )
    assert store.add_report(report) == (report, True)
    assert store.add_report(report) == (report, False)  # a retry still compares equal
    assert store.get_report("a", report.id) == report
    text = new_report("a", (record.id,), feedback=NUL, metadata={})
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
    record_store.add_records([lookalike])
    assert record_store.get_record("a", lookalike.id) == lookalike


def test_get_records_reads_by_id_in_batches_scoped_to_the_scenario(
    record_store: RecordStore, store: SQLStore, make_record: MakeRecord
) -> None:
    base = store.ensure_scenario("a").head_release_id
    other = store.ensure_scenario("b").head_release_id
    mine = [make_record("a", base) for _ in range(1203)]  # more than one IN (...) batch
    theirs = make_record("b", other)
    record_store.add_records([*mine, theirs])

    wanted = [r.id for r in mine[::-2]] + [mine[0].id, "rec_unknown", theirs.id]
    got = record_store.get_records("a", wanted)
    assert [r.id for r in got] == sorted({r.id for r in mine[::-2]} | {mine[0].id})
    by_id = {r.id: r for r in mine}
    assert all(r == by_id[r.id] for r in got)  # whole records, exactly as stored
    assert record_store.get_records("a", []) == []
    assert record_store.get_records("b", [mine[1].id]) == []


def test_quoted_records_are_the_reported_ones_of_the_scenario_once_each(
    record_store: RecordStore, store: SQLStore, make_record: MakeRecord
) -> None:
    base = store.ensure_scenario("q").head_release_id
    other = store.ensure_scenario("q2").head_release_id
    mine = [make_record("q", base) for _ in range(7)]
    theirs = make_record("q2", other)
    record_store.add_records([*mine, theirs])
    assert record_store.quoted_records("q") == []
    store.add_report(new_report("q", (mine[5].id,)))
    store.add_report(new_report("q", (mine[1].id, mine[5].id)))  # a second report on one record
    store.add_report(new_report("q2", (theirs.id,)))
    got = record_store.quoted_records("q")
    assert got == sorted([mine[1], mine[5]], key=lambda r: r.id)  # whole records, in id order
    assert record_store.quoted_records("q2") == [theirs]


def test_session_records_is_the_parent_chain_ending_at_the_tail(
    record_store: RecordStore, session_store: SessionStore, store: SQLStore, make_record: MakeRecord
) -> None:
    base = store.ensure_scenario("a").head_release_id
    ses, fork = new_id("ses"), new_id("ses")
    turns: list[Record] = []
    for k in range(4):
        parent = turns[-1].id if turns else None
        turns.append(make_record("a", base, session_id=ses, turn=k, parent_id=parent))
    # a fork: a new session whose first record continues turn 1 of the first one
    forked = [make_record("a", base, session_id=fork, turn=2, parent_id=turns[1].id)]
    forked.append(make_record("a", base, session_id=fork, turn=3, parent_id=forked[0].id))
    noise = make_record("a", base, session_id=new_id("ses"), turn=0)
    record_store.add_records([*turns, *forked, noise])

    assert session_store.session_records("a", ses) == turns
    assert session_store.session_records("a", fork) == [turns[0], turns[1], *forked]
    assert [r.id for r in session_store.session_records("a", fork, limit=3)] == [
        turns[1].id,
        *(r.id for r in forked),
    ]
    assert session_store.session_records("a", "ses_unknown") == []
    assert session_store.session_records("b", ses) == []


def test_session_fields_round_trip(
    record_store: RecordStore, store: SQLStore, make_record: MakeRecord
) -> None:
    release = _base(store)
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
    record_store.add_records([parent, child, plain])
    assert record_store.get_record("exp", child.id) == child
    assert record_store.get_record("exp", plain.id) == plain
    assert (plain.session_id, plain.turn, plain.parent_id, plain.idempotency_key) == (None,) * 4
    assert record_store.list_records("exp") == sorted([parent, child, plain], key=lambda r: r.id)


def test_find_session_parent_picks_the_longest(
    record_store: RecordStore, session_store: SessionStore, store: SQLStore, make_record: MakeRecord
) -> None:
    release = _base(store)
    t0 = utcnow()
    short = make_record("exp", release, turn=0, state_hash="1" * 64, created_at=t0)
    long_new = make_record(
        "exp", release, turn=1, state_hash="2" * 64, created_at=t0 + timedelta(seconds=2)
    )
    long_old = make_record(
        "exp", release, turn=1, state_hash="2" * 64, created_at=t0 + timedelta(seconds=1)
    )
    record_store.add_records([short, long_new, long_old])
    # Hashes come longest conversation first; equal states (two users asked the same and got
    # the same answer) go to the newest record not continued yet.
    assert session_store.find_session_parent("exp", ["2" * 64, "1" * 64]) == long_new
    record_store.add_records([make_record("exp", release, turn=2, parent_id=long_new.id)])
    assert session_store.find_session_parent("exp", ["2" * 64, "1" * 64]) == long_old
    record_store.add_records([make_record("exp", release, turn=2, parent_id=long_old.id)])
    assert session_store.find_session_parent("exp", ["2" * 64, "1" * 64]) == long_new
    assert session_store.find_session_parent("exp", ["9" * 64, "1" * 64]) == short
    assert session_store.find_session_parent("exp", ["9" * 64]) is None
    assert session_store.find_session_parent("exp", []) is None
    store.create_scenario("other")
    assert session_store.find_session_parent("other", ["1" * 64]) is None


def test_session_tail_and_children(
    record_store: RecordStore, session_store: SessionStore, store: SQLStore, make_record: MakeRecord
) -> None:
    release = _base(store)
    r0 = make_record("exp", release, session_id="ses_a", turn=0)
    r1 = make_record("exp", release, session_id="ses_a", turn=1, parent_id=r0.id)
    r2 = make_record("exp", release, session_id="ses_a", turn=2, parent_id=r1.id)
    fork = make_record("exp", release, session_id="ses_b", turn=1, parent_id=r0.id)
    record_store.add_records([r2, r0, fork, r1])
    assert session_store.session_tail("exp", "ses_a") == r2
    assert session_store.session_tail("exp", "ses_b") == fork
    assert session_store.session_tail("exp", "ses_none") is None
    assert session_store.has_children("exp", r0.id)
    assert session_store.has_children("exp", r1.id)
    assert not session_store.has_children("exp", r2.id)
    assert not session_store.has_children("exp", fork.id)
    store.create_scenario("other")
    assert session_store.session_tail("other", "ses_a") is None
    assert not session_store.has_children("other", r0.id)


def test_idempotency_key_is_unique_per_scenario(
    record_store: RecordStore, store: SQLStore, make_record: MakeRecord
) -> None:
    one = _base(store, "one")
    two = _base(store, "two")
    first = make_record("one", one, idempotency_key="k")
    record_store.add_records([first])
    assert record_store.find_idempotent("one", "chat.completions", "k") == first
    assert record_store.find_idempotent("one", "chat.completions", "other") is None
    assert record_store.find_idempotent("two", "chat.completions", "k") is None

    with pytest.raises(IdempotencyKeyReused, match="already used by record"):
        record_store.add_records([make_record("one", one, idempotency_key="k")])
    assert isinstance(IdempotencyKeyReused("x"), Conflict)
    # Same key in another scenario, and any number of records without a key: no clash.
    record_store.add_records([make_record("two", two, idempotency_key="k")])
    record_store.add_records([make_record("one", one) for _ in range(3)])
    assert len(record_store.list_records("one")) == 4


def test_delete_records_spares_those_a_new_report_quotes(
    record_store: RecordStore, store: SQLStore, make_record: MakeRecord
) -> None:
    base = _base(store, "a")
    recs = [make_record("a", base) for _ in range(4)]
    store.add_records(recs)
    known, _ = store.add_report(new_report("a", (recs[0].id,)))
    # Feedback that arrived after the caller chose what to delete keeps its record.
    store.add_report(new_report("a", (recs[1].id,)))

    doomed = [r.id for r in recs[:3]]
    deleted = record_store.delete_records("a", doomed, {recs[0].id: {known.id}})
    assert deleted == {recs[0].id, recs[2].id}
    assert record_store.list_records("a") == sorted([recs[1], recs[3]], key=lambda r: r.id)
    assert record_store.delete_records("a", [], {}) == set()
