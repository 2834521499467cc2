"""Jobs (POST /reef/train's progress) and harness candidates' fields, on every backend; and
migration 0004 up and down."""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import inspect, text

from reef.errors import BadRequest, NotFound
from reef.records import Job, new_id, utcnow
from reef.store import tables
from reef.store.sql import SQLStore, open_store
from tests.store.test_store_releases import _alembic, _candidate, _count


def _job(scenario: str) -> Job:
    now = utcnow()
    return Job(
        id=new_id("job"),
        scenario=scenario,
        kind="instruct",
        status="queued",
        request={"text": "Cite the file you changed."},
        created_at=now,
        updated_at=now,
        steps=[{"at": now.isoformat(), "step": "queued"}],
    )


def test_job_progress_is_appended_and_read_back(store: SQLStore) -> None:
    store.create_scenario("jobs")
    job = store.add_job(_job("jobs"))
    assert store.get_job("jobs", job.id) == job

    store.update_job("jobs", job.id, status="running", step={"step": "proposing", "mode": "x"})
    done = store.update_job(
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
    assert store.get_job("jobs", job.id) == done

    failed = store.update_job("jobs", job.id, status="failed", message="the proposer is down")
    assert failed.message == "the proposer is down" and len(failed.steps) == 3


def test_job_errors(store: SQLStore) -> None:
    store.create_scenario("jobs-err")
    with pytest.raises(NotFound):
        store.add_job(_job("nowhere"))
    with pytest.raises(NotFound):
        store.get_job("jobs-err", "job_missing")
    with pytest.raises(NotFound):
        store.update_job("jobs-err", "job_missing", status="done")
    job = store.add_job(_job("jobs-err"))
    with pytest.raises(BadRequest):
        store.update_job("jobs-err", job.id, status="finished")
    with pytest.raises(NotFound):  # a job is read within its own scenario only
        store.create_scenario("jobs-other")
        store.get_job("jobs-other", job.id)

    store.delete_scenario("jobs-err")
    assert _count(store, tables.jobs, "jobs-err") == 0


def test_a_harness_candidate_keeps_its_operation_and_metadata(store: SQLStore) -> None:
    scen = store.create_scenario("hc")
    meta = {
        "harness": {"key": "harness/hc/ab", "content_hash": "sha256:ab"},
        "weights_release_id": "r",
    }
    cand = store.add_candidate(
        _candidate("hc", scen.head_release_id, operation="harness", metadata=meta, kind="base")
    )
    got = store.get_candidate("hc", cand.id)
    assert (got.operation, got.metadata) == ("harness", meta)
    plain = store.add_candidate(_candidate("hc", scen.head_release_id))
    assert (plain.operation, plain.metadata) == ("training", {})


def test_migration_0004_up_and_down(database_url: str) -> None:
    s = open_store(database_url)
    try:
        _alembic(s, command.upgrade, "0003")
        scen = "m4"
        with s.engine.begin() as conn:  # a scenario and a candidate written before 0004
            conn.execute(
                text(
                    "INSERT INTO scenarios (name, created_at, head_release_id) "
                    "VALUES (:s, '2025-01-01 00:00:00', 'rel_m4')"
                ),
                {"s": scen},
            )
            conn.execute(
                text(
                    "INSERT INTO releases (id, scenario, seq, parent_id, kind, created_at, uri, "
                    "metadata) VALUES ('rel_m4', :s, 0, NULL, 'base', '2025-01-01 00:00:00', "
                    "NULL, '{}')"
                ),
                {"s": scen},
            )
            conn.execute(
                text(
                    "INSERT INTO candidates (id, scenario, parent_id, kind, created_at, status, "
                    "metrics, gate, updated_at) VALUES ('rel_c4', :s, 'rel_m4', 'adapter', "
                    "'2025-01-01 00:00:00', 'pending', '{}', '{}', '2025-01-01 00:00:00')"
                ),
                {"s": scen},
            )
        s.migrate()
        old = s.get_candidate(scen, "rel_c4")
        assert (old.operation, old.metadata) == ("training", {})
        s.add_job(_job(scen))

        _alembic(s, command.downgrade, "0003")
        assert "jobs" not in inspect(s.engine).get_table_names()
        columns = {c["name"] for c in inspect(s.engine).get_columns("candidates")}
        assert "operation" not in columns and "metadata" not in columns
        s.migrate()
        assert s.get_candidate(scen, "rel_c4").status == "pending"
    finally:
        s.close()
