"""What the candidates page shows: the candidates waiting for review and those decided, each
with its gate's numbers, who approved it and its links out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reef.api.ui.views.releases import GuardLine, Links, gate_numbers, guard_lines
from reef.records import Candidate, Release


@dataclass(frozen=True)
class CandidateRow:
    """One candidate: a card while pending, a table row once decided."""

    candidate: Candidate
    gate: dict[str, Any]  # gate_numbers
    guards: tuple[GuardLine, ...]  # the gate's guards
    approval: dict[str, Any] | None  # {"by", "via"}: on the release it became, if approved
    mlflow: str | None
    flow_run: str | None

    @property
    def pending(self) -> bool:
        return self.candidate.status == "pending"


def candidate_rows(
    candidates: list[Candidate], chain: list[Release], links: Links
) -> list[CandidateRow]:
    """A row per candidate (in the order given: the store's, newest first); `chain` is the
    scenario's releases, where an approved candidate's approval is recorded."""
    released = {r.id: r for r in chain}
    return [
        CandidateRow(
            candidate=c,
            gate=gate_numbers(c.gate),
            guards=guard_lines(c.gate),
            approval=released[c.id].metadata.get("approval") if c.id in released else None,
            mlflow=links.mlflow(c.model_uri),
            flow_run=links.flow_run(c.metadata.get("flow_run_id")),
        )
        for c in candidates
    ]
