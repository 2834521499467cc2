"""Reports in the store: the reports themselves, the receipts they quote (report_references),
the recipes' consumption receipts, and the sums readiness and rollouts take over them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import (
    Connection,
    Float,
    String,
    case,
    cast,
    delete,
    func,
    insert,
    literal,
    select,
    true,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from reef.errors import Conflict, StoreError
from reef.records import GUARD_RELEASE, GUARD_TAG, USER_TAG, Consumption, Report, Slice
from reef.store import tables
from reef.store.connect import describe_error
from reef.store.database import IN_CHUNK, Database
from reef.store.rows import REPORT_COLUMNS, id_at, report_of, report_row, reports_of


class ReportStore(Protocol):
    """Reports and what hangs on them: the records each quotes, the records each recipe has
    consumed, and aggregates over both."""

    def add_report(self, report: Report) -> tuple[Report, bool]:
        """Store a report; returns (stored report, created).

        Same id and same content as a stored one of the same scenario: returns the stored
        one, created=False. Same id, different content: Conflict. Ids are unique per
        scenario: another scenario's reports never clash.
        """
        ...

    def get_report(self, scenario: str, report_id: str) -> Report: ...

    def list_reports(
        self, scenario: str, after: str | None = None, limit: int = 100
    ) -> list[Report]: ...

    def delete_reports(self, scenario: str, reports: Sequence[Report]) -> int:
        """Delete these reports and their report_references rows in one transaction; returns
        how many reports went."""
        ...

    def quoting_reports(self, scenario: str, record_ids: Iterable[str]) -> dict[str, set[str]]:
        """For each of `record_ids` that some report quotes, the ids of the reports quoting
        it: lookups on the report_references key, nothing scanned."""
        ...

    # consumption receipts -----------------------------------------------------------------
    def add_consumptions(self, consumptions: Sequence[Consumption]) -> None:
        """Record that a training batch consumed these records (idempotent per
        (scenario, recipe, record_id): the first receipt wins)."""
        ...

    def consumed_record_ids(self, scenario: str, recipe: str) -> set[str]: ...

    # aggregates ---------------------------------------------------------------------------
    def count_awaiting_feedback(
        self, scenario: str, recipe: str, within: Slice | None = None
    ) -> int:
        """How many records of `scenario` no report of it quotes and `recipe` has not consumed
        (`within` a slice: only its records: carrying each of its tags with its value, of its
        sessions, served to its users): one aggregate query, no record read into memory."""
        ...

    def arm_sums(
        self, scenario: str, release_id: str, since: datetime, low: float, high: float
    ) -> tuple[int, float]:
        """Over the scores reports gave the records `release_id` served since `since` (a
        rollout's arm): how many, and their sum with each score clipped to [low, high]. One
        covering scan of the report references (record ids sort by time)."""
        ...


class SQLReports(Database, ReportStore):
    """ReportStore on SQLite or Postgres."""

    def add_report(self, report: Report) -> tuple[Report, bool]:
        try:
            with self._tx(f"adding report '{report.id}'", write=True) as conn:
                conn.execute(insert(tables.reports).values(report_row(report)))
                self._insert_references(conn, report)
            return report, True
        except IntegrityError as e:
            clash = e
        # Insert first, compare on a clash: race-safe (the database picks the one winner) and
        # cheapest for the usual case, a new report.
        t = tables.reports
        with self._tx(f"reading report '{report.id}'") as conn:
            row = conn.execute(
                select(t).where(t.c.scenario == report.scenario, t.c.id == report.id)
            ).first()
            if row is None:
                self._require_scenario(conn, report.scenario)
                raise StoreError(f"adding report '{report.id}' failed: {describe_error(clash)}")
        if row.content_hash == report.content_hash:
            return report_of(row), False
        raise Conflict(f"report_id {report.id} already exists with different content")

    def _insert_references(self, conn: Connection, report: Report) -> None:
        """The report's receipts as report_references rows, with the release that served each
        record: one INSERT ... SELECT over the records' primary key. A guard answer was served
        by no release (reef.guard_answers): its rows carry GUARD_RELEASE, so no release's
        scores and no rollout arm count a reviewer's score of it."""
        r, x = tables.records, tables.report_references
        refs = list(dict.fromkeys(report.references))
        served_by = case(
            (r.c.tags[GUARD_TAG].as_string().is_not(None), literal(GUARD_RELEASE, String)),
            else_=r.c.release_id,
        )
        for i in range(0, len(refs), IN_CHUNK):
            quoted = select(
                r.c.scenario,
                r.c.id,
                literal(report.id, String).label("report_id"),
                served_by.label("release_id"),
                literal(report.score, Float).label("score"),
            ).where(r.c.scenario == report.scenario, r.c.id.in_(refs[i : i + IN_CHUNK]))
            conn.execute(
                insert(x).from_select(
                    ["scenario", "record_id", "report_id", "release_id", "score"], quoted
                )
            )

    def get_report(self, scenario: str, report_id: str) -> Report:
        return report_of(self._one(tables.reports, scenario, report_id, "report"))

    def list_reports(
        self, scenario: str, after: str | None = None, limit: int = 100
    ) -> list[Report]:
        return reports_of(
            self._page(tables.reports, scenario, after, limit, "report", REPORT_COLUMNS)
        )

    def delete_reports(self, scenario: str, reports: Sequence[Report]) -> int:
        p, x = tables.reports, tables.report_references
        with self._tx(f"deleting archived reports of '{scenario}'", write=True) as conn:
            for i in range(0, len(reports), IN_CHUNK):
                chunk = reports[i : i + IN_CHUNK]
                ids = [rep.id for rep in chunk]
                refs = sorted({rid for rep in chunk for rid in rep.references})
                conn.execute(delete(p).where(p.c.scenario == scenario, p.c.id.in_(ids)))
                # by (scenario, record_id), the reference table's key, then the report ids
                for j in range(0, len(refs), IN_CHUNK):
                    conn.execute(
                        delete(x).where(
                            x.c.scenario == scenario,
                            x.c.record_id.in_(refs[j : j + IN_CHUNK]),
                            x.c.report_id.in_(ids),
                        )
                    )
        return len(reports)

    def quoting_reports(self, scenario: str, record_ids: Iterable[str]) -> dict[str, set[str]]:
        x = tables.report_references
        wanted = list(dict.fromkeys(record_ids))
        out: dict[str, set[str]] = {}
        with self._tx(f"reading the reports quoting records of '{scenario}'") as conn:
            for i in range(0, len(wanted), IN_CHUNK):
                query = select(x.c.record_id, x.c.report_id).where(
                    x.c.scenario == scenario, x.c.record_id.in_(wanted[i : i + IN_CHUNK])
                )
                for record_id, report_id in conn.execute(query):
                    out.setdefault(record_id, set()).add(report_id)
        return out

    # consumption receipts -----------------------------------------------------------------
    def add_consumptions(self, consumptions: Sequence[Consumption]) -> None:
        if not consumptions:
            return
        what = f"adding {len(consumptions)} consumption receipts"
        try:
            with self._tx(what, write=True) as conn:
                insert_consumptions(conn, consumptions)
        except IntegrityError as e:
            with self._tx(f"checking a failed insert of {what}") as conn:
                for name in sorted({c.scenario for c in consumptions}):
                    self._require_scenario(conn, name)  # NotFound names the missing one
            raise StoreError(f"{what} failed: {describe_error(e)}") from e

    def consumed_record_ids(self, scenario: str, recipe: str) -> set[str]:
        t = tables.consumptions
        query = select(t.c.record_id).where(t.c.scenario == scenario, t.c.recipe == recipe)
        with self._tx(f"reading consumption receipts of '{scenario}'") as conn:
            return set(conn.scalars(query))

    # aggregates ---------------------------------------------------------------------------
    def count_awaiting_feedback(
        self, scenario: str, recipe: str, within: Slice | None = None
    ) -> int:
        r, p, c = tables.records, tables.reports, tables.consumptions
        part = within or Slice()
        # The receipts the scenario's reports quote, expanded from their JSON lists in the
        # database: a scan of the reports (few), never of the records (many).
        if self._sqlite:
            refs = func.json_each(p.c.references).table_valued("value")
            quoted: Any = refs.c.value
        else:
            refs = func.jsonb_array_elements_text(p.c.references).table_valued("value")
            quoted = refs.c.value.collate("C")  # ids compare bytewise (see tables.Key)
        query = (
            select(func.count())
            .select_from(r)
            .where(
                r.c.scenario == scenario,
                r.c.id.not_in(
                    select(quoted).select_from(p).join(refs, true()).where(p.c.scenario == scenario)
                ),
                # NOT IN (not NOT EXISTS): one hashed set of the recipe's receipts whatever the
                # planner believes of the table's size (measured: a nested anti-join on stale
                # Postgres statistics took 350 ms at 100k records, the hashed set 20 ms)
                r.c.id.not_in(
                    select(c.c.record_id).where(c.c.scenario == scenario, c.c.recipe == recipe)
                ),
                *(r.c.tags[name].as_string() == value for name, value in part.tags.items()),
                *([r.c.session_id.in_(part.sessions)] if part.sessions else []),
                *([r.c.tags[USER_TAG].as_string().in_(part.users)] if part.users else []),
            )
        )
        with self._tx(f"counting records awaiting feedback in '{scenario}'") as conn:
            return int(conn.execute(query).scalar_one())

    def arm_sums(
        self, scenario: str, release_id: str, since: datetime, low: float, high: float
    ) -> tuple[int, float]:
        x = tables.report_references
        clipped = self._clipped(cast(x.c.score, Float), low, high)
        query = select(func.count(), func.coalesce(func.sum(clipped), 0.0)).where(
            x.c.scenario == scenario,
            x.c.release_id == release_id,
            x.c.score.is_not(None),
            x.c.record_id >= id_at("rec", since),
        )
        with self._tx(f"summing report scores of '{release_id}'") as conn:
            n, total = conn.execute(query).one()
        return int(n), float(total)


def insert_consumptions(conn: Connection, consumptions: Sequence[Consumption]) -> None:
    """Write consumption receipts in the caller's transaction (the chain's publish calls it, so
    a batch is consumed exactly when the release it trained joins the chain). A receipt already
    stored stays as it is: the first batch that consumed a record wins."""
    rows = [
        {
            "scenario": c.scenario,
            "recipe": c.recipe,
            "record_id": c.record_id,
            "batch_id": c.batch_id,
            "created_at": c.created_at,
        }
        for c in consumptions
    ]
    dialect_insert = sqlite.insert if conn.dialect.name == "sqlite" else postgresql.insert
    stmt = dialect_insert(tables.consumptions).on_conflict_do_nothing(
        index_elements=["scenario", "recipe", "record_id"]
    )
    for i in range(0, len(rows), IN_CHUNK):
        conn.execute(stmt, rows[i : i + IN_CHUNK])
