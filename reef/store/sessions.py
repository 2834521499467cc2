"""Sessions in the store: the records a conversation is stitched from (parent links, turns,
the conversation state a continuation matches)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from sqlalchemy import case, exists, literal_column, select

from reef.records import Record
from reef.store import tables
from reef.store.database import IN_CHUNK, Database
from reef.store.rows import record_of


class SessionStore(Protocol):
    """Sessions: the parent a continuation extends, a session's tail and its turns."""

    def find_session_parent(self, scenario: str, state_hashes: Sequence[str]) -> Record | None:
        """Of the records whose conversation state (request messages + answer, hashed by
        reef.sessions) is one of `state_hashes`, the one with the longest conversation; among
        equal states, the newest record that has no continuation yet, else the newest. `state_hashes` come longest conversation first, as
        reef.sessions.candidate_hashes returns them: the first hash that matches wins."""
        ...

    def session_tail(self, scenario: str, session_id: str) -> Record | None:
        """The record with the highest turn in the session, if the session exists."""
        ...

    def session_records(self, scenario: str, session_id: str, limit: int = 1000) -> list[Record]:
        """A session's records, first turn first: the chain of parent links that ends at the
        session's tail (`session_tail`), so a fork starts with the turns it branched from. At
        most the last `limit` of them; empty for an unknown session. One query."""
        ...

    def has_children(self, scenario: str, record_id: str) -> bool:
        """Whether any record names `record_id` as its parent (a later one is then a fork)."""
        ...


class SQLSessions(Database, SessionStore):
    """SessionStore on SQLite or Postgres."""

    def _first_record(self, query: Any, what: str) -> Record | None:
        with self._tx(what) as conn:
            row = conn.execute(query.limit(1)).first()
        return None if row is None else record_of(row)

    def find_session_parent(self, scenario: str, state_hashes: Sequence[str]) -> Record | None:
        hashes = list(dict.fromkeys(state_hashes))[:IN_CHUNK]
        if not hashes:
            return None
        t = tables.records
        child = t.alias("child")
        # The caller lists the hashes longest conversation first: rank by that position.
        rank = case({h: i for i, h in enumerate(hashes)}, value=t.c.state_hash)
        # Equal states (many users asked the same and got the same answer): the newest one not
        # continued yet is the conversation a client goes on with; the oldest would make every
        # later one a fork of it, and leave their answers without a next turn.
        continued = case(
            (exists().where(child.c.parent_id == t.c.id, child.c.scenario == t.c.scenario), 1),
            else_=0,
        )
        query = (
            select(t)
            .where(t.c.scenario == scenario, t.c.state_hash.in_(hashes))
            .order_by(rank, continued, t.c.created_at.desc(), t.c.id.desc())
        )
        return self._first_record(query, f"looking up a session parent in '{scenario}'")

    def session_tail(self, scenario: str, session_id: str) -> Record | None:
        t = tables.records
        query = (
            select(t)
            .where(t.c.scenario == scenario, t.c.session_id == session_id)
            .order_by(t.c.turn.desc(), t.c.id.desc())
        )
        return self._first_record(query, f"reading session '{session_id}'")

    def session_records(self, scenario: str, session_id: str, limit: int = 1000) -> list[Record]:
        t = tables.records
        tail = (
            select(t.c.id)
            .where(t.c.scenario == scenario, t.c.session_id == session_id)
            .order_by(t.c.turn.desc(), t.c.id.desc())
            .limit(1)
            .scalar_subquery()
        )
        # From the tail up its parent links, one indexed lookup per turn, in one statement.
        chain = (
            select(t.c.id, t.c.parent_id, literal_column("1").label("depth"))
            .where(t.c.scenario == scenario, t.c.id == tail)
            .cte("chain", recursive=True)
        )
        chain = chain.union_all(
            select(t.c.id, t.c.parent_id, chain.c.depth + 1)
            .join(chain, t.c.id == chain.c.parent_id)
            .where(t.c.scenario == scenario, chain.c.depth < limit)
        )
        query = select(t).join(chain, t.c.id == chain.c.id).order_by(chain.c.depth.desc())
        with self._tx(f"reading session '{session_id}'") as conn:
            return [record_of(row) for row in conn.execute(query)]

    def has_children(self, scenario: str, record_id: str) -> bool:
        t = tables.records
        query = select(exists().where(t.c.parent_id == record_id, t.c.scenario == scenario))
        with self._tx(f"looking up children of record '{record_id}'") as conn:
            return bool(conn.execute(query).scalar())
