"""JobStore's contract on every backend: a job's progress (POST /reef/train) is appended step
by step and read back within its scenario."""

from __future__ import annotations

import pytest

from reef.errors import BadRequest, NotFound
from reef.store import tables
from reef.store.jobs import JobStore
from reef.store.sql import SQLStore
from tests.store.builders import count_rows, new_job


def test_job_progress_is_appended_and_read_back(job_store: JobStore, store: SQLStore) -> None:
    store.create_scenario("jobs")
    job = job_store.add_job(new_job("jobs"))
    assert job_store.get_job("jobs", job.id) == job

    job_store.update_job("jobs", job.id, status="running", step={"step": "proposing", "mode": "x"})
    done = job_store.update_job(
        "jobs",
        job.id,
        status="done",
        step={"step": "pending_review"},
        candidate_id="rel_1",
        result={"diff": {"created": ["AGENTS.md"]}},
    )
    assert done.status == "done" and done.candidate_id == "rel_1"
    assert [s["step"] for s in done.steps] == ["queued", "proposing", "pending_review"]
    assert done.steps[1]["mode"] == "x" and done.steps[1]["at"]
    assert done.result == {"diff": {"created": ["AGENTS.md"]}}
    assert done.updated_at >= job.updated_at
    assert job_store.get_job("jobs", job.id) == done

    failed = job_store.update_job("jobs", job.id, status="failed", message="the proposer is down")
    assert failed.message == "the proposer is down" and len(failed.steps) == 3


def test_job_errors(job_store: JobStore, store: SQLStore) -> None:
    store.create_scenario("jobs-err")
    with pytest.raises(NotFound):
        job_store.add_job(new_job("nowhere"))
    with pytest.raises(NotFound):
        job_store.get_job("jobs-err", "job_missing")
    with pytest.raises(NotFound):
        job_store.update_job("jobs-err", "job_missing", status="done")
    job = job_store.add_job(new_job("jobs-err"))
    with pytest.raises(BadRequest):
        job_store.update_job("jobs-err", job.id, status="finished")
    with pytest.raises(NotFound):  # a job is read within its own scenario only
        store.create_scenario("jobs-other")
        job_store.get_job("jobs-other", job.id)

    store.delete_scenario("jobs-err")
    assert count_rows(store, tables.jobs, "jobs-err") == 0
