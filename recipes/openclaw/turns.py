"""Rollout rows (reef.datasets SCHEMAS["rollout"]) as judged turns, and the rows left out and why.

A judged turn is one recorded exchange a judge scored (reef.judge): the engine's exact token
ids, its generation-time top-K capture (the student set of the distillation term), the
judge's vote as the RL reward and its hint candidates. OpenClaw-RL's dispatch
table decides what it trains: hints make hint-enhanced teachers; a ±1 vote without hints makes
the anchor teacher (the plain prompt); a 0 without hints trains nothing.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reef.judge import dispatch

if TYPE_CHECKING:
    import pyarrow as pa

COLUMNS = (
    "sample_id",
    "staleness",
    "score",
    "messages",
    "prompt_token_ids",
    "completion_token_ids",
    "completion_mask",
    "report_metadata",
    "topk_ids",
)


@dataclass(frozen=True)
class JudgedTurn:
    sample_id: str
    messages: tuple[dict[str, Any], ...]  # the turn's prompt, for hint-enhanced teachers
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    topk_ids: tuple[tuple[int, ...], ...]  # S^q_t per response token
    reward: int  # the judge's vote, raw (§2.1: no normalisation)
    hints: tuple[str, ...]  # teacher candidates; empty: the anchor (the plain prompt)
    staleness: int


def turns_from(
    table: pa.Table, thumbs: float | None = None
) -> tuple[list[JudgedTurn], Counter[str]]:
    """The table's trainable turns in dataset order, and the dropped rows counted by reason.

    `thumbs`: read scores as thumbs up/down instead of votes, +1 at or above it, -1 below
    (score-only feedback on [0, 1] without a judge)."""
    kept: list[JudgedTurn] = []
    dropped: Counter[str] = Counter()
    for row in table.select(list(COLUMNS)).to_pylist():
        if thumbs is not None and row["score"] is not None and math.isfinite(row["score"]):
            row["score"] = 1.0 if row["score"] >= thumbs else -1.0
        reason, turn = _turn(row)
        if turn is None:
            dropped[reason or "unknown"] += 1
        else:
            kept.append(turn)
    return kept, dropped


def _turn(row: dict[str, Any]) -> tuple[str | None, JudgedTurn | None]:
    """(None, the turn) or (why it cannot train, None): one reason, the first that applies."""
    if row["staleness"] < 0:
        return "negative_staleness", None
    score = row["score"]
    if score is None or not math.isfinite(score) or score not in (-1.0, 0.0, 1.0):
        return "not_a_vote", None  # the RL term takes a judge's vote in {-1, 0, +1}
    if not row["prompt_token_ids"]:
        return "empty_prompt", None
    if any(m == 0 for m in row["completion_mask"]):
        return "multi_turn", None  # a judged turn is one exchange, never a flattened session
    completion = row["completion_token_ids"]
    topk = row["topk_ids"]
    if topk is None or len(topk) != len(completion) or not completion or any(not r for r in topk):
        return "no_topk_capture", None  # the capture does not cover the response (§2.1)
    hints = _hints(row["report_metadata"])
    d = dispatch(int(score), hints)
    if d is None:
        return "no_signal", None  # a 0 vote and no hint: nothing to learn (§2.2)
    return None, JudgedTurn(
        sample_id=row["sample_id"],
        messages=tuple(json.loads(row["messages"])),
        prompt_ids=tuple(row["prompt_token_ids"]),
        completion_ids=tuple(completion),
        topk_ids=tuple(tuple(r) for r in topk),
        reward=d.reward,
        hints=hints if d.teacher == "hints" else (),
        staleness=int(row["staleness"]),
    )


def _hints(metadata: str | None) -> tuple[str, ...]:
    if not metadata:
        return ()
    value = json.loads(metadata)
    hints = value.get("hints") if isinstance(value, dict) else None
    if not isinstance(hints, list):
        return ()
    return tuple(h for h in hints if isinstance(h, str) and h.strip())
