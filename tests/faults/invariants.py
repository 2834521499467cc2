"""What every fault row checks once the system has recovered, read from the database itself:
nothing acknowledged is lost, every batch trained once and consumed, the chain and the
candidates agree."""

from __future__ import annotations

import json
import os
from typing import Any

from sqlalchemy import select

from reef.store import tables
from reef.store.sql import SQLStore


def lost(store: SQLStore, scenario: str, receipts: list[str], reports: list[str]) -> list[str]:
    """The acknowledged receipts (a 200 carried them) and reports (a 201 said stored) that the
    database does not hold."""
    records = {r.id for r in store.list_records(scenario, limit=100_000)}
    stored = {r.id for r in store.list_reports(scenario, limit=100_000)}
    return [r for r in receipts if r not in records] + [p for p in reports if p not in stored]


def loop_violations(store: SQLStore, scenario: str, reported: set[str]) -> list[str]:
    """How the scenario's chain, candidates and consumption receipts break the loop's rules:
    the head is a published release; every training release on the chain is a candidate marked
    published, and every candidate marked published is on the chain; every reported record is
    consumed, by a batch whose candidate is on the chain; every training release consumed its
    batch."""
    out: list[str] = []
    chain = store.list_releases(scenario)
    on_chain = {r.id for r in chain}
    head = store.get_scenario(scenario).head_release_id
    if head != max(chain, key=lambda r: r.seq).id:
        out.append(f"the head {head} is not the newest release of the chain")
    candidates = {c.id: c for c in store.list_candidates(scenario)}
    for r in chain:
        if r.operation == "training" and candidates.get(r.id) is None:
            out.append(f"release {r.id} has no candidate")
        elif r.operation == "training" and candidates[r.id].status != "published":
            out.append(
                f"release {r.id} is on the chain, its candidate is {candidates[r.id].status}"
            )
    for c in candidates.values():
        if c.status == "published" and c.id not in on_chain:
            out.append(f"candidate {c.id} is marked published but is not on the chain")
        if c.status == "pending" and c.id not in on_chain:
            out.append(f"candidate {c.id} was left pending by a run that died")
    t = tables.consumptions
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(t.c.record_id, t.c.batch_id).where(t.c.scenario == scenario)
        ).all()
    batch_of = {r.record_id: r.batch_id for r in rows}
    unconsumed = reported - set(batch_of)
    if unconsumed:
        out.append(f"{len(unconsumed)} reported records never consumed")
    for batch in set(batch_of.values()) - on_chain:
        out.append(f"batch {batch} was consumed by a candidate not on the chain")
    for r in chain:
        if r.operation == "training" and r.id not in set(batch_of.values()):
            out.append(f"release {r.id} consumed no batch: its reports stay unconsumed")
    return out


def measured(row: str, numbers: dict[str, Any]) -> None:
    """A row's measured numbers: printed, and appended as a JSON line to the file
    REEF_FAULTS_RESULTS names (pytest-xdist shows no worker's output)."""
    line = json.dumps({"row": row, **numbers})
    print(line)
    if path := os.environ.get("REEF_FAULTS_RESULTS"):
        with open(path, "a") as f:
            f.write(line + "\n")
