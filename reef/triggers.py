"""Triggers: what a serving process tells its evolve worker, one JSON object per line of the
worker's stdin, written by `encode` and read by `parse` (the one parser).

    {"kind": "evolve", "scenario": "support"}                a report arrived (or the dashboard
                                                             asked): is a batch ready?
    {"kind": "job", "scenario": "support", "job_id": "job_…"}  a user's job (POST /reef/train)
    {"kind": "scan"}                                         look at every scenario (the schedule)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, get_args

from reef.errors import BadRequest

Kind = Literal["evolve", "job", "scan"]


@dataclass(frozen=True)
class Trigger:
    """One reason for the worker to look: a scenario, a user's job, or every scenario."""

    kind: Kind
    scenario: str | None = None
    job_id: str | None = None

    @classmethod
    def evolve(cls, scenario: str) -> Trigger:
        return cls("evolve", scenario)

    @classmethod
    def job(cls, scenario: str, job_id: str) -> Trigger:
        return cls("job", scenario, job_id)

    @classmethod
    def scan(cls) -> Trigger:
        return cls("scan")


def encode(trigger: Trigger) -> str:
    """The line for `trigger`, newline included."""
    out: dict[str, Any] = {"kind": trigger.kind}
    if trigger.scenario is not None:
        out["scenario"] = trigger.scenario
    if trigger.job_id is not None:
        out["job_id"] = trigger.job_id
    return json.dumps(out, separators=(",", ":")) + "\n"


def parse(line: str) -> Trigger:
    """The trigger a line carries; BadRequest when it is not one."""
    try:
        body = json.loads(line)
    except ValueError:
        raise BadRequest(f"not a JSON trigger: {line.strip()[:200]!r}") from None
    if not isinstance(body, dict) or body.get("kind") not in get_args(Kind):
        raise BadRequest(f"not a trigger (kind evolve | job | scan): {line.strip()[:200]!r}")
    unknown = set(body) - {"kind", "scenario", "job_id"}
    if unknown:
        raise BadRequest(f"unknown trigger fields {sorted(unknown)}: {line.strip()[:200]!r}")
    kind, scenario, job_id = body["kind"], body.get("scenario"), body.get("job_id")
    for name, value in (("scenario", scenario), ("job_id", job_id)):
        if value is not None and (not isinstance(value, str) or not value):
            raise BadRequest(f"trigger field {name} must be a non-empty string: {line!r}")
    if kind != "scan" and scenario is None:
        raise BadRequest(f"a {kind} trigger names a scenario: {line.strip()[:200]!r}")
    if (kind == "job") != (job_id is not None):
        raise BadRequest(f"job_id goes with a job trigger only: {line.strip()[:200]!r}")
    return Trigger(kind, scenario, job_id)
