"""Jobs in the store: a long request's progress (POST /reef/train), appended step by step."""

from __future__ import annotations

from typing import Any, Protocol

from sqlalchemy import insert, select, update

from reef.errors import BadRequest, NotFound
from reef.records import JOB_STATUSES, Job, utcnow
from reef.store import tables
from reef.store.database import Database
from reef.store.rows import job_of, job_row


class JobStore(Protocol):
    """Jobs: stored when a long request starts, updated as it goes."""

    def add_job(self, job: Job) -> Job:
        """Store a new job; NotFound if its scenario does not exist."""
        ...

    def get_job(self, scenario: str, job_id: str) -> Job: ...

    def update_job(
        self,
        scenario: str,
        job_id: str,
        *,
        status: str | None = None,
        step: dict[str, Any] | None = None,
        candidate_id: str | None = None,
        result: dict[str, Any] | None = None,
        message: str | None = None,
    ) -> Job:
        """Set what is given (None leaves it), append `step` to the job's progress steps (with
        the time), and stamp `updated_at`; returns the job as stored."""
        ...


class SQLJobs(Database, JobStore):
    """JobStore on SQLite or Postgres."""

    def add_job(self, job: Job) -> Job:
        _check_job_status(job.status)
        with self._tx(f"adding job '{job.id}'", write=True) as conn:
            self._require_scenario(conn, job.scenario)
            conn.execute(insert(tables.jobs).values(job_row(job)))
        return job

    def get_job(self, scenario: str, job_id: str) -> Job:
        return job_of(self._one(tables.jobs, scenario, job_id, "job"))

    def update_job(
        self,
        scenario: str,
        job_id: str,
        *,
        status: str | None = None,
        step: dict[str, Any] | None = None,
        candidate_id: str | None = None,
        result: dict[str, Any] | None = None,
        message: str | None = None,
    ) -> Job:
        if status is not None:
            _check_job_status(status)
        j = tables.jobs
        with self._tx(f"updating job '{job_id}'", write=True) as conn:
            row = conn.execute(
                select(j).where(j.c.scenario == scenario, j.c.id == job_id).with_for_update()
            ).first()
            if row is None:
                self._require_scenario(conn, scenario)
                raise NotFound(f"job '{job_id}' not found in scenario '{scenario}'")
            now = utcnow()
            values: dict[str, Any] = {"updated_at": now}
            if status is not None:
                values["status"] = status
            if step is not None:
                values["steps"] = [*row.steps, {"at": now.isoformat(), **step}]
            if candidate_id is not None:
                values["candidate_id"] = candidate_id
            if result is not None:
                values["result"] = result
            if message is not None:
                values["message"] = message
            conn.execute(update(j).where(j.c.id == job_id).values(values))
            row = conn.execute(select(j).where(j.c.id == job_id)).one()
        return job_of(row)


def _check_job_status(status: str) -> None:
    if status not in JOB_STATUSES:
        raise BadRequest(
            f"unknown job status {status!r}: use one of {sorted(JOB_STATUSES)}", param="status"
        )
