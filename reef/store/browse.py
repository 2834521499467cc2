"""Read-only queries for the dashboard: filtered record pages, a record's reports, traffic and
score aggregates, jobs. Every query walks an index; none reads a whole scenario.

Why bounded windows: a filter the indexes cannot answer (text search over prompt and answer, a
tag, a release) is checked row by row while walking the (scenario, id) index newest first. A
rare match would walk the whole scenario, so a page looks at most `window` records below its
cursor and says where it stopped; the next page goes on from there. That keeps every page of
the dashboard within its time budget at any scenario size (bench/ui_pages.py measures it).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Float, Text, and_, cast, exists, func, literal, select, union_all

from reef.errors import BadRequest
from reef.intervals import mean_interval, natural_range
from reef.records import GUARD_TAG, IMPORTED_TAG, Job, Record, Report, utcnow
from reef.store import tables
from reef.store.base import Store
from reef.store.rows import id_at as id_at  # re-exported: callers import it from here
from reef.store.rows import job_of, record_of, report_of

# Text search compares this much of each request's and answer's JSON text, over at most
# `Browse.text_window` records a page: any scoped token can repeat a search, so its cost is
# bounded by these, not by the bodies' size (up to server.max_body_bytes each).
TEXT_SCAN_CHARS = 8192

_IN_CHUNK = 500


@dataclass(frozen=True)
class RecordFilter:
    """What the records list is narrowed to; every field is optional."""

    release_id: str | None = None
    tag: str | None = None  # "name=value" (or "name": the tag is present)
    min_score: float | None = None
    max_score: float | None = None
    feedback: bool | None = None  # True: quoted by a report; False: not yet
    since: datetime | None = None
    until: datetime | None = None
    text: str | None = None  # a substring of the request or the answer, any case

    @property
    def scans(self) -> bool:
        """Whether rows are checked one by one (then a page looks at a bounded window)."""
        return any(
            v not in (None, "")
            for v in (
                self.release_id,
                self.tag,
                self.min_score,
                self.max_score,
                self.feedback,
                self.text,
            )
        )


@dataclass(frozen=True)
class Feedback:
    """What a record's reports say, in short."""

    reports: int = 0
    mean_score: float | None = None


@dataclass(frozen=True)
class RecordPage:
    records: list[Record]
    feedback: dict[str, Feedback]
    next_before: str | None  # the cursor of the next (older) page; None at the end
    window_end: bool  # the page stopped at its window, not because it was full


@dataclass(frozen=True)
class ScoreStats:
    """Scores reported on the traffic a release served: their mean with a 95% interval, inside
    `bounds` when every score lay in one of the natural ranges (reef.intervals)."""

    n: int
    mean: float
    low: float
    high: float
    bounds: tuple[float, float] | None = None

    @classmethod
    def of(
        cls, n: int, total: float, total_sq: float, smallest: float, largest: float
    ) -> ScoreStats:
        mean = total / n
        variance = max(0.0, total_sq / n - mean * mean) * (n / (n - 1) if n > 1 else 0.0)
        bounds = natural_range(smallest, largest)
        low, high = mean_interval(n, mean, variance, bounds)
        return cls(n, mean, low, high, bounds)


@dataclass(frozen=True)
class Traffic:
    """A scenario's last day: records per hour (oldest first), feedback rate and mean score."""

    hourly: list[int]
    records: int
    quoted: int
    mean_score: float | None
    total: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def feedback_rate(self) -> float | None:
        return self.quoted / self.records if self.records else None


class Browse:
    """The dashboard's queries over a SQL store (SQLite or Postgres)."""

    def __init__(self, store: Store, window: int = 20_000, text_window: int = 2_000):
        engine = getattr(store, "engine", None)
        if engine is None:
            raise BadRequest("the dashboard needs a SQL store")
        self.engine = engine
        self.window = window
        self.text_window = text_window
        self._sqlite = engine.dialect.name == "sqlite"

    # records --------------------------------------------------------------------
    def records(
        self, scenario: str, flt: RecordFilter, before: str | None = None, limit: int = 50
    ) -> RecordPage:
        """A page of records newest first, below the cursor `before`."""
        r = tables.records
        conds: list[Any] = [r.c.scenario == scenario]
        if before:
            conds.append(r.c.id < before)
        if flt.until is not None:
            conds.append(r.c.id < id_at("rec", flt.until))
        if flt.since is not None:
            conds.append(r.c.id >= id_at("rec", flt.since))
        with self.engine.connect() as conn:
            floor = None
            if flt.scans:
                window = min(self.window, self.text_window) if flt.text else self.window
                floor = conn.execute(
                    select(r.c.id).where(*conds).order_by(r.c.id.desc()).offset(window - 1).limit(1)
                ).scalar()
                if floor is not None:
                    conds.append(r.c.id >= floor)
            conds += self._filters(flt)
            rows = conn.execute(
                select(r).where(*conds).order_by(r.c.id.desc()).limit(limit + 1)
            ).all()
            records = [record_of(row) for row in rows[:limit]]
            feedback = self._feedback(conn, scenario, [x.id for x in records])
        if len(rows) > limit:
            return RecordPage(records, feedback, records[-1].id, window_end=False)
        if floor is not None:  # the window ran out before the page filled: go on below it
            return RecordPage(records, feedback, floor, window_end=True)
        return RecordPage(records, feedback, None, window_end=False)

    def _filters(self, flt: RecordFilter) -> list[Any]:
        r, x = tables.records, tables.report_references
        out: list[Any] = []
        if flt.release_id:
            out.append(r.c.release_id == flt.release_id)
        if flt.tag:
            name, eq, value = flt.tag.partition("=")
            tag = r.c.tags[name.strip()].as_string()
            out.append(tag == value.strip() if eq else tag.is_not(None))
        quoted = and_(x.c.scenario == r.c.scenario, x.c.record_id == r.c.id)
        if flt.min_score is not None or flt.max_score is not None:
            scored = [quoted]
            if flt.min_score is not None:
                scored.append(x.c.score >= flt.min_score)
            if flt.max_score is not None:
                scored.append(x.c.score <= flt.max_score)
            out.append(exists().where(*scored))
        if flt.feedback is True:
            out.append(exists().where(quoted))
        elif flt.feedback is False:
            out.append(~exists().where(quoted))
        if flt.text:
            escaped = flt.text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            pattern = f"%{escaped}%"
            request, response = (
                func.substr(cast(column, Text), 1, TEXT_SCAN_CHARS)
                for column in (r.c.request, r.c.response)
            )
            if self._sqlite:  # SQLite's LIKE ignores ASCII case: no lower() copies
                out.append(request.like(pattern, escape="\\") | response.like(pattern, escape="\\"))
            else:
                out.append(
                    request.ilike(pattern, escape="\\") | response.ilike(pattern, escape="\\")
                )
        return out

    def _feedback(self, conn: Any, scenario: str, ids: list[str]) -> dict[str, Feedback]:
        if not ids:
            return {}
        x = tables.report_references
        rows = conn.execute(
            select(x.c.record_id, func.count(), func.avg(x.c.score))
            .where(x.c.scenario == scenario, x.c.record_id.in_(ids))
            .group_by(x.c.record_id)
        ).all()
        return {
            row[0]: Feedback(int(row[1]), None if row[2] is None else float(row[2])) for row in rows
        }

    def reports_for(self, scenario: str, record_ids: Iterable[str]) -> dict[str, list[Report]]:
        """The reports quoting each of `record_ids` (a session's turns), oldest first."""
        x, p = tables.report_references, tables.reports
        wanted = list(dict.fromkeys(record_ids))
        out: dict[str, list[Report]] = {i: [] for i in wanted}
        with self.engine.connect() as conn:
            for i in range(0, len(wanted), _IN_CHUNK):
                chunk = wanted[i : i + _IN_CHUNK]
                query = (
                    select(x.c.record_id, p)
                    .join(p, and_(p.c.scenario == x.c.scenario, p.c.id == x.c.report_id))
                    .where(x.c.scenario == scenario, x.c.record_id.in_(chunk))
                    .order_by(p.c.created_at)
                )
                for row in conn.execute(query):
                    out[row[0]].append(report_of(row))
        return out

    # aggregates -----------------------------------------------------------------
    def traffic(self, scenario: str, hours: int = 24, now: datetime | None = None) -> Traffic:
        """Records per hour over the last `hours`, and how many of them reports quote: one scan
        of the window's entries in the (scenario, id) index (ids sort by time). Served traffic
        only: imported records (reef.imports) and guard answers (reef.guard_answers) are left
        out."""
        r, x = tables.records, tables.report_references
        served = r.c.tags[IMPORTED_TAG].as_string().is_(None) & r.c.tags[GUARD_TAG].as_string().is_(
            None
        )
        now = now or utcnow()
        start = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours - 1)
        edges = [id_at("rec", start + timedelta(hours=h)) for h in range(hours)]
        edges.append(id_at("rec", now + timedelta(seconds=1)))
        # one statement of 24 index range counts (a CASE per hour over the window's rows is
        # 10x slower on SQLite, one query per hour pays 24 round trips)
        counts = union_all(
            *(
                select(literal(h).label("h"), func.count().label("n"))
                .select_from(r)
                .where(r.c.scenario == scenario, r.c.id >= lo, r.c.id < hi, served)
                for h, (lo, hi) in enumerate(itertools.pairwise(edges))
            )
        )
        with self.engine.connect() as conn:
            by_hour = dict(conn.execute(select(counts.subquery())).tuples().all())
            hourly = [int(by_hour.get(h, 0)) for h in range(hours)]
            quoted = conn.execute(
                select(func.count(func.distinct(x.c.record_id)), func.avg(x.c.score))
                .select_from(x.join(r, (r.c.scenario == x.c.scenario) & (r.c.id == x.c.record_id)))
                .where(x.c.scenario == scenario, x.c.record_id >= edges[0], served)
            ).one()
        return Traffic(
            hourly=hourly,
            records=sum(hourly),
            quoted=int(quoted[0]),
            mean_score=None if quoted[1] is None else float(quoted[1]),
        )

    def release_scores(self, scenario: str) -> dict[str, ScoreStats]:
        """Per release: the scores reports gave the records it served (a covering index scan
        of the scenario's report references)."""
        x = tables.report_references
        score = cast(x.c.score, Float)
        query = (
            select(
                x.c.release_id,
                func.count(),
                func.sum(score),
                func.sum(score * score),
                func.min(score),
                func.max(score),
            )
            .where(x.c.scenario == scenario, x.c.score.is_not(None))
            .group_by(x.c.release_id)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return {
            release_id: ScoreStats.of(int(n), float(total), float(sq), float(lo), float(hi))
            for release_id, n, total, sq, lo, hi in rows
        }

    def release_metrics(self, scenario: str) -> dict[str, dict[str, ScoreStats]]:
        """Per release, per named metric (reef.metrics) that is a number or a boolean (true 1,
        false 0): what reports gave the records it served, over the latest `window` quotes.
        Categorical metrics are counted nowhere here: they have no mean."""
        x, p = tables.report_references, tables.reports
        query = (
            select(x.c.release_id, p.c.metrics)
            .join(p, p.c.id == x.c.report_id)
            .where(x.c.scenario == scenario, p.c.scenario == scenario)
            .order_by(x.c.record_id.desc())
            .limit(self.window)
        )
        sums: dict[tuple[str, str], list[float]] = {}
        with self.engine.connect() as conn:
            for release_id, metrics in conn.execute(query):
                for name, value in (metrics or {}).items():
                    if isinstance(value, bool):
                        value = 1.0 if value else 0.0
                    if not isinstance(value, int | float):
                        continue
                    acc = sums.setdefault((release_id, name), [0, 0.0, 0.0, value, value])
                    acc[0] += 1
                    acc[1] += value
                    acc[2] += value * value
                    acc[3], acc[4] = min(acc[3], value), max(acc[4], value)
        out: dict[str, dict[str, ScoreStats]] = {}
        for (release_id, name), (n, total, sq, lo, hi) in sums.items():
            out.setdefault(release_id, {})[name] = ScoreStats.of(int(n), total, sq, lo, hi)
        return out

    # jobs -----------------------------------------------------------------------
    def jobs(self, scenario: str, limit: int = 50) -> list[Job]:
        """The scenario's jobs, newest first (the (scenario, created_at) index)."""
        j = tables.jobs
        query = (
            select(j)
            .where(j.c.scenario == scenario)
            .order_by(j.c.created_at.desc(), j.c.id.desc())
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return [job_of(row) for row in conn.execute(query)]
