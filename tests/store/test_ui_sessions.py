"""Dashboard sessions in the database (reef.store.ui_sessions), SQLite and Postgres: what one
replica opens another reads, a sign-out ends it for all, expired ones are gone, and only
digests are stored."""

from __future__ import annotations

import hashlib

from sqlalchemy import select

from reef.store import tables
from reef.store.sql import SQLStore
from reef.store.ui_sessions import UISessions


def test_open_read_close_across_instances(store: SQLStore) -> None:
    one, other = UISessions(store), UISessions(store)  # two replicas on one database
    token = hashlib.sha256(b"reef_token").hexdigest()
    sid = one.open(token, ttl_s=60)
    found = other.get(sid)
    assert found is not None and found.token_sha256 == token and len(found.csrf) >= 32
    assert other.get(sid + "x") is None and other.get(None) is None
    with store.engine.connect() as conn:
        stored = conn.execute(select(tables.ui_sessions.c.id_sha256)).scalars().all()
    assert sid not in stored and hashlib.sha256(sid.encode()).hexdigest() in stored
    other.close(sid)
    assert one.get(sid) is None and other.get(sid) is None
    other.close(sid)  # closing twice is no error


def test_expired_sessions_sign_nobody_in_and_are_removed(store: SQLStore) -> None:
    sessions = UISessions(store)
    gone = sessions.open("a" * 64, ttl_s=-1)
    assert sessions.get(gone) is None
    live = sessions.open("b" * 64, ttl_s=60)  # opening removes the expired
    with store.engine.connect() as conn:
        left = conn.execute(select(tables.ui_sessions.c.token_sha256)).scalars().all()
    assert left == ["b" * 64] and sessions.get(live) is not None
