"""The dashboard's sign-in sessions, kept in the database (table `ui_sessions`).

Why the database rather than memory or a signed cookie: behind several replicas a session
opened on one must be known to all (no sticky routing needed), and signing out must end it
on all. A signed, self-contained cookie would satisfy the first but not the second: a copy of
the cookie stays valid until it expires wherever the signature checks, unless every replica
consults a shared revocation list, which is this table again. Here signing out deletes the
row, and the next request on any replica finds nothing.

Only digests are stored: the cookie's random id as its sha256 (whoever reads the table cannot
sign in with it) and the token as its sha256, which the caller resolves against the tokens
configured now, so a token removed from the configuration ends its sessions too. Each
session carries its own CSRF token, which forms must echo.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, delete, insert, select
from sqlalchemy.exc import SQLAlchemyError

from reef.errors import BadRequest, StoreError
from reef.records import utcnow
from reef.store import tables
from reef.store.base import Store


@dataclass(frozen=True)
class SignIn:
    """One open session: whose token opened it, its forms' CSRF token, when it ends."""

    token_sha256: str
    csrf: str
    expires_at: datetime


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class UISessions:
    """Open, look up and close dashboard sessions in a SQL store's database."""

    def __init__(self, store: Store):
        engine = getattr(store, "engine", None)
        if engine is None:
            raise BadRequest("the dashboard needs a SQL store")
        self.engine = engine

    @contextmanager
    def _tx(self, what: str, *, write: bool = False) -> Iterator[Connection]:
        try:
            with self.engine.connect() as conn:
                if write:
                    conn.execution_options(reef_write=True)  # SQLite: take the lock up front
                with conn.begin():
                    yield conn
        except SQLAlchemyError as e:
            raise StoreError(f"database error while {what}: {e}") from e

    def open(self, token_sha256: str, ttl_s: float) -> str:
        """A new session for the token with this digest; returns the cookie's id. Sessions
        past their expiry are removed on the way (an index range on `expires_at`)."""
        sid = secrets.token_urlsafe(32)
        now = utcnow()
        t = tables.ui_sessions
        with self._tx("opening a dashboard session", write=True) as conn:
            conn.execute(delete(t).where(t.c.expires_at <= now))
            conn.execute(
                insert(t).values(
                    id_sha256=_digest(sid),
                    token_sha256=token_sha256,
                    csrf=secrets.token_urlsafe(32),
                    created_at=now,
                    expires_at=now + timedelta(seconds=ttl_s),
                )
            )
        return sid

    def get(self, session_id: str | None) -> SignIn | None:
        """The open session with this cookie id; None when unknown, closed or expired."""
        if not session_id:
            return None
        t = tables.ui_sessions
        with self._tx("reading a dashboard session") as conn:
            row = conn.execute(
                select(t.c.token_sha256, t.c.csrf, t.c.expires_at).where(
                    t.c.id_sha256 == _digest(session_id), t.c.expires_at > utcnow()
                )
            ).first()
        return None if row is None else SignIn(row.token_sha256, row.csrf, row.expires_at)

    def close(self, session_id: str | None) -> None:
        """End the session (sign-out) for every replica; no-op when there is none."""
        if not session_id:
            return
        t = tables.ui_sessions
        with self._tx("closing a dashboard session", write=True) as conn:
            conn.execute(delete(t).where(t.c.id_sha256 == _digest(session_id)))
