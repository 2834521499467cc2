"""Shadow records in the store: a shadow rollout's answers (reef.shadow) and their score sums."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from sqlalchemy import func, insert, select
from sqlalchemy.exc import IntegrityError

from reef.errors import StoreError
from reef.records import ShadowRecord
from reef.store import tables
from reef.store.connect import describe_error
from reef.store.database import Database


class ShadowStore(Protocol):
    """Shadow records: the candidate's answer to a copy of a served call, with both scores."""

    def add_shadow_records(self, shadows: Sequence[ShadowRecord]) -> None:
        """Store shadow rollouts' answers (reef.shadow) in one transaction."""
        ...

    def list_shadow_records(
        self,
        scenario: str,
        release_id: str | None = None,
        after: str | None = None,
        limit: int = 100,
    ) -> list[ShadowRecord]:
        """The scenario's shadow records (only `release_id`'s, if given), oldest first."""
        ...

    def shadow_sums(
        self, scenario: str, release_id: str, low: float, high: float
    ) -> tuple[int, float, float]:
        """Over `release_id`'s shadow records with both scores: how many, the sum of the
        shadow's scores and of the head's, each score clipped to [low, high]."""
        ...


class SQLShadows(Database, ShadowStore):
    """ShadowStore on SQLite or Postgres."""

    def add_shadow_records(self, shadows: Sequence[ShadowRecord]) -> None:
        if not shadows:
            return
        names = [f.name for f in dataclasses.fields(ShadowRecord)]
        rows = [{name: getattr(s, name) for name in names} for s in shadows]
        try:
            with self._tx(f"storing {len(rows)} shadow records", write=True) as conn:
                conn.execute(insert(tables.shadow_records), rows)
        except IntegrityError as e:
            raise StoreError(f"storing shadow records: {describe_error(e)}") from e

    def list_shadow_records(
        self,
        scenario: str,
        release_id: str | None = None,
        after: str | None = None,
        limit: int = 100,
    ) -> list[ShadowRecord]:
        t = tables.shadow_records
        query = select(t).where(t.c.scenario == scenario)
        if release_id is not None:
            query = query.where(t.c.release_id == release_id)
        if after is not None:
            query = query.where(t.c.id > after)
        query = query.order_by(t.c.id).limit(max(limit, 0))
        with self._tx(f"listing shadow records of scenario '{scenario}'") as conn:
            rows = conn.execute(query).all()
            if not rows:
                self._require_scenario(conn, scenario)
        return [ShadowRecord(**dict(r._mapping)) for r in rows]

    def shadow_sums(
        self, scenario: str, release_id: str, low: float, high: float
    ) -> tuple[int, float, float]:
        t = tables.shadow_records
        shadow = self._clipped(t.c.score, low, high)
        control = self._clipped(t.c.control_score, low, high)
        query = select(
            func.count(),
            func.coalesce(func.sum(shadow), 0.0),
            func.coalesce(func.sum(control), 0.0),
        ).where(
            t.c.scenario == scenario,
            t.c.release_id == release_id,
            t.c.score.is_not(None),
            t.c.control_score.is_not(None),
        )
        with self._tx(f"summing shadow scores of '{release_id}'") as conn:
            n, shadow_total, control_total = conn.execute(query).one()
        return int(n), float(shadow_total), float(control_total)
