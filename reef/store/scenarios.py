"""Scenarios in the store: created with their base release, deleted with a tombstone."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from sqlalchemy import Connection, delete, insert, select
from sqlalchemy.exc import IntegrityError

from reef.errors import Conflict, NotFound, StoreError
from reef.records import Deletion, Release, Scenario, SettingsVersion, new_id, utcnow
from reef.store import tables
from reef.store.connect import describe_error
from reef.store.database import Database
from reef.store.rows import release_row, scenario_of


class ScenarioStore(Protocol):
    """A scenario's row: its creation (with the base release, seq 0), lookup and deletion."""

    def ensure_scenario(self, name: str) -> Scenario:
        """The scenario, created with its base release (seq 0) on first use; race-safe."""
        ...

    def create_scenario(self, name: str, description: str | None = None) -> Scenario:
        """Create explicitly; Conflict if it exists."""
        ...

    def get_scenario(self, name: str) -> Scenario: ...

    def list_scenarios(self) -> list[Scenario]: ...

    def delete_scenario(self, name: str) -> None:
        """Delete the scenario with all its records, reports, releases and candidates, and leave
        a tombstone (`pending_deletions`) in the same transaction: the commit point of a
        deletion. NotFound when there is no such scenario (deleted already, say)."""
        ...

    def pending_deletions(self) -> list[Deletion]:
        """Deleted scenarios whose files and MLflow entries may still exist, oldest first.
        While a name is here, creating a scenario of that name is a Conflict."""
        ...

    def finish_deletion(self, name: str) -> None:
        """Drop the tombstone of `name` (its outside state is gone); no-op when there is none."""
        ...

    def set_scenario_settings(
        self, name: str, settings: dict[str, Any], changed_by: str, expected_version: int
    ) -> SettingsVersion:
        """Append version `expected_version + 1` of the scenario's run-time learning settings
        (compare-and-swap: Conflict when another change came first). NotFound without the
        scenario."""
        ...

    def scenario_settings(self, name: str, limit: int = 20) -> list[SettingsVersion]:
        """The scenario's run-time settings versions, newest first (empty: none set)."""
        ...


class SQLScenarios(Database, ScenarioStore):
    """ScenarioStore on SQLite or Postgres."""

    def _insert_scenario(self, name: str, description: str | None) -> Scenario:
        now = utcnow()
        release_id = new_id("rel")
        with self._tx(f"creating scenario '{name}'", write=True) as conn:
            # The head foreign key is deferred: both rows are checked together at commit.
            conn.execute(
                insert(tables.scenarios).values(
                    name=name, description=description, created_at=now, head_release_id=release_id
                )
            )
            base = Release(
                id=release_id,
                scenario=name,
                seq=0,
                parent_id=None,
                kind="base",
                created_at=now,
                operation="creation",
            )
            conn.execute(insert(tables.releases).values(release_row(base)))
            # Checked after the insert: on Postgres a deletion committing meanwhile is then
            # seen (the insert waited for its row lock); on SQLite writers take turns anyway.
            self._refuse_deleted_name(conn, name)
        return Scenario(
            name=name, created_at=now, head_release_id=release_id, description=description
        )

    def ensure_scenario(self, name: str) -> Scenario:
        try:
            return self.get_scenario(name)
        except NotFound:
            pass
        try:
            return self._insert_scenario(name, None)
        except IntegrityError:
            # Another thread or process created it between our read and our insert.
            return self.get_scenario(name)

    def create_scenario(self, name: str, description: str | None = None) -> Scenario:
        try:
            return self._insert_scenario(name, description)
        except IntegrityError:
            raise Conflict(f"scenario '{name}' already exists") from None

    def get_scenario(self, name: str) -> Scenario:
        with self._tx(f"reading scenario '{name}'") as conn:
            row = conn.execute(
                select(tables.scenarios).where(tables.scenarios.c.name == name)
            ).first()
        if row is None:
            raise NotFound(f"scenario '{name}' not found")
        return scenario_of(row)

    def list_scenarios(self) -> list[Scenario]:
        with self._tx("listing scenarios") as conn:
            rows = conn.execute(select(tables.scenarios).order_by(tables.scenarios.c.name)).all()
        return [scenario_of(r) for r in rows]

    def delete_scenario(self, name: str) -> None:
        try:
            with self._tx(f"deleting scenario '{name}'", write=True) as conn:
                self._require_scenario(conn, name)
                # Explicit rather than trusting ON DELETE CASCADE alone: the result must not
                # depend on a connection having foreign keys switched on. Candidates go before
                # releases: a candidate's parent is a release.
                for table in (
                    tables.consumptions,
                    tables.records,
                    tables.reports,
                    tables.report_references,
                    tables.shadow_records,
                    tables.candidates,
                    tables.jobs,
                    tables.scenario_settings,
                    tables.review_items,
                    tables.releases,
                ):
                    conn.execute(delete(table).where(table.c.scenario == name))
                conn.execute(delete(tables.scenarios).where(tables.scenarios.c.name == name))
                # The tombstone commits with the deletion: the files and MLflow entries it
                # names are removed afterwards (reef.deletion), and a crash in between leaves
                # it here for `reef gc`.
                d = tables.scenario_deletions
                conn.execute(delete(d).where(d.c.name == name))
                conn.execute(insert(d).values(name=name, deleted_at=utcnow()))
        except IntegrityError as e:
            raise StoreError(f"deleting scenario '{name}' failed: {describe_error(e)}") from e

    def _refuse_deleted_name(self, conn: Connection, name: str) -> None:
        d = tables.scenario_deletions
        if conn.execute(select(d.c.name).where(d.c.name == name)).first() is not None:
            raise Conflict(
                f"scenario '{name}' was deleted and its files are still being removed: "
                "run `reef gc`, then use the name again",
                code="scenario_deleting",
            )

    def pending_deletions(self) -> list[Deletion]:
        d = tables.scenario_deletions
        with self._tx("listing pending scenario deletions") as conn:
            rows = conn.execute(select(d).order_by(d.c.deleted_at, d.c.name)).all()
        return [Deletion(scenario=r.name, deleted_at=r.deleted_at) for r in rows]

    def set_scenario_settings(
        self, name: str, settings: dict[str, Any], changed_by: str, expected_version: int
    ) -> SettingsVersion:
        t = tables.scenario_settings
        version = SettingsVersion(name, expected_version + 1, settings, changed_by, utcnow())
        try:
            with self._tx(f"setting the settings of scenario '{name}'", write=True) as conn:
                self._require_scenario(conn, name)
                conn.execute(insert(t).values(**dataclasses.asdict(version)))
        except IntegrityError:
            raise Conflict(
                f"the settings of scenario '{name}' changed since version {expected_version}: "
                "read them again",
                code="settings_changed",
            ) from None
        return version

    def scenario_settings(self, name: str, limit: int = 20) -> list[SettingsVersion]:
        t = tables.scenario_settings
        query = select(t).where(t.c.scenario == name).order_by(t.c.version.desc()).limit(limit)
        with self._tx(f"reading the settings of scenario '{name}'") as conn:
            rows = conn.execute(query).all()
        return [
            SettingsVersion(r.scenario, r.version, r.settings, r.changed_by, r.changed_at)
            for r in rows
        ]

    def finish_deletion(self, name: str) -> None:
        d = tables.scenario_deletions
        with self._tx(f"finishing the deletion of scenario '{name}'", write=True) as conn:
            conn.execute(delete(d).where(d.c.name == name))
