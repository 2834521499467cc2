"""The engine registry in the store: which serving engines are alive, for a deploy's fan-out."""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol

from sqlalchemy import delete, insert, select, update

from reef.records import utcnow
from reef.store import tables
from reef.store.database import Database


class EngineStore(Protocol):
    """Engines' admin URLs with their heartbeats (engine.registry)."""

    def register_engine(self, url: str, *, started: bool = False) -> None:
        """Say the engine at admin URL `url` is alive now (its heartbeat); `started`: it has
        just started (a new row, or a row of an earlier run taken over)."""
        ...

    def live_engines(self, max_age_s: float) -> list[str]:
        """The admin URLs of engines whose heartbeat is at most `max_age_s` old, sorted."""
        ...

    def unregister_engine(self, url: str) -> None:
        """The engine at `url` stopped (a clean shutdown); no-op when it is not registered."""
        ...


class SQLEngines(Database, EngineStore):
    """EngineStore on SQLite or Postgres."""

    def register_engine(self, url: str, *, started: bool = False) -> None:
        t = tables.engines
        now = utcnow()
        values = {"heartbeat_at": now, **({"started_at": now} if started else {})}
        with self._tx(f"registering engine {url}", write=True) as conn:
            if conn.execute(update(t).where(t.c.url == url).values(**values)).rowcount == 0:
                conn.execute(insert(t).values(url=url, started_at=now, heartbeat_at=now))

    def live_engines(self, max_age_s: float) -> list[str]:
        t = tables.engines
        since = utcnow() - timedelta(seconds=max_age_s)
        with self._tx("listing registered engines") as conn:
            rows = conn.execute(select(t.c.url).where(t.c.heartbeat_at >= since).order_by(t.c.url))
            return [r.url for r in rows]

    def unregister_engine(self, url: str) -> None:
        t = tables.engines
        with self._tx(f"unregistering engine {url}", write=True) as conn:
            conn.execute(delete(t).where(t.c.url == url))
