"""What the release chain shows: one row per release with the gate's numbers, the scores its
traffic got, who approved it and its links out (MLflow, Prefect); and a harness diff."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from reef.figures import Figure
from reef.records import Release
from reef.store.browse import ScoreStats

GATE_KEYS = (
    "status",
    "policy",
    "test",
    "n",
    "mean_candidate",
    "mean_head",
    "mean_diff",
    "ci_low",
    "p_value",
    "margin",
    "reason",
)


def gate_numbers(gate: dict[str, Any]) -> dict[str, Any]:
    """The gate's decision in the words the timeline uses (its set keys, in GATE_KEYS' order)."""
    return {k: gate[k] for k in GATE_KEYS if gate.get(k) not in (None, "")}


@dataclass(frozen=True)
class GuardLine:
    """One gate guard's check, as the release and candidate pages show it: the guard's held-out
    mean for the candidate and for the head it was compared with, and whether the candidate
    was shown safe (too little evidence is "not shown safe", never "no harm found")."""

    name: str
    safe: bool
    candidate: float | None
    head: float | None
    n: int
    max_drop: float
    reason: str


def guard_lines(gate: dict[str, Any]) -> tuple[GuardLine, ...]:
    """The guards of a stored gate decision (reef.gate.Decision.as_dict), in its order."""
    out = []
    for g in gate.get("guards") or ():
        if not isinstance(g, dict) or not g.get("name"):
            continue
        out.append(
            GuardLine(
                name=str(g["name"]),
                safe=not g.get("broken", True),
                candidate=_number(g.get("mean_candidate")),
                head=_number(g.get("mean_head")),
                n=int(g.get("n") or 0),
                max_drop=float(g.get("max_drop") or 0.0),
                reason=str(g.get("reason") or ""),
            )
        )
    return tuple(out)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Links:
    """Where a release's outside pages are: the MLflow tracking server and the Prefect UI
    (Settings.tracking_uri and .prefect_ui_url, read once per page)."""

    tracking_uri: str
    prefect_ui: str | None

    def mlflow(self, model_uri: str | None) -> str | None:
        """The MLflow UI page of a model version, when the tracking server is one we can
        link."""
        if not model_uri or not model_uri.startswith("models:/"):
            return None
        if not self.tracking_uri.startswith(("http://", "https://")):
            return None
        model, _, version = model_uri.removeprefix("models:/").rpartition("/")
        base = self.tracking_uri.rstrip("/")
        return f"{base}/#/models/{quote(model)}/versions/{quote(version)}"

    def flow_run(self, run_id: Any) -> str | None:
        """The Prefect UI page of the flow run that made a release, when the UI's address is
        known."""
        if not self.prefect_ui or not isinstance(run_id, str) or not run_id:
            return None
        return f"{self.prefect_ui}/runs/flow-run/{quote(run_id)}"


@dataclass(frozen=True)
class ReleaseRow:
    """One release of the timeline."""

    release: Release
    gate: dict[str, Any]  # gate_numbers
    guards: tuple[GuardLine, ...]  # the gate's guards
    figures: tuple[tuple[str, float], ...]  # (title, value): held-out figures measured on it
    score: ScoreStats | None  # what reports said of the traffic it served
    mlflow: str | None  # the model version's page
    flow_run: str | None  # the Prefect flow run's page
    approval: dict[str, Any] | None  # {"by", "via"} when a person approved it
    source: str | None  # a rollback's: the release whose content it serves again
    harness: bool  # it carries a harness: a diff against its parent exists
    parts: tuple[Part, ...] = ()  # a composite release's steps, in the order they ran


@dataclass(frozen=True)
class Part:
    """One step of a composite release: its gate's verdict and why; `released`: it is part
    of this release (its gate passed)."""

    name: str
    status: str
    reason: str
    released: bool


def parts(metadata: dict[str, Any]) -> tuple[Part, ...]:
    """The steps a composite release's metadata names (none for any other release)."""
    composite = metadata.get("composite")
    if not isinstance(composite, dict):
        return ()
    steps = composite.get("steps") or {}
    released = composite.get("released") or []
    return tuple(
        Part(name, str(step.get("status", "")), str(step.get("reason", "")), name in released)
        for name in composite.get("order") or steps
        if isinstance(step := steps.get(name), dict)
    )


def release_rows(
    chain: list[Release],
    scores: dict[str, ScoreStats],
    links: Links,
    figures: Sequence[Figure] = (),
) -> list[ReleaseRow]:
    """The timeline's rows, head first, of `chain` (oldest first, as the store lists it), each
    with the value `figures` give it (a figure's latest point on the release)."""
    measured: dict[str, dict[str, float]] = {}
    for f in figures:
        for p in f.points:
            measured.setdefault(p.release_id, {})[f.title] = p.value
    return [
        ReleaseRow(
            release=r,
            gate=gate_numbers(r.gate),
            guards=guard_lines(r.gate),
            figures=tuple(measured.get(r.id, {}).items()),
            score=scores.get(r.id),
            mlflow=links.mlflow(r.model_uri),
            flow_run=links.flow_run(r.metadata.get("flow_run_id")),
            approval=r.metadata.get("approval"),
            source=r.metadata.get("source_release_id"),
            harness=isinstance(r.metadata.get("harness"), dict),
            parts=parts(r.metadata),
        )
        for r in reversed(chain)
    ]


@dataclass(frozen=True)
class FileDiff:
    """One changed file of a harness against its parent's."""

    path: str
    status: str  # added, removed or changed
    lines: tuple[str, ...]  # unified diff


def diff(old: dict[str, str], new: dict[str, str]) -> list[FileDiff]:
    """A unified diff per changed file of two harness trees (path -> text)."""
    out = []
    for path in sorted(set(old) | set(new)):
        a, b = old.get(path), new.get(path)
        if a == b:
            continue
        lines = difflib.unified_diff(
            (a or "").splitlines(),
            (b or "").splitlines(),
            fromfile=f"a/{path}" if a is not None else "/dev/null",
            tofile=f"b/{path}" if b is not None else "/dev/null",
            lineterm="",
        )
        status = "added" if a is None else "removed" if b is None else "changed"
        out.append(FileDiff(path, status, tuple(lines)))
    return out
