"""gate: when a candidate may replace the head, and the guard task sets it must not break."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from reef.settings.section import DOTTED, Section


class GuardSettings(Section):
    """gate.guards[]: a fixed task set on which the candidate must show it is no worse than the head, within
    `max_drop` (reef.gate)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="named in a rejection")
    dataset: Path = Field(description="JSONL of {messages, answer?, ...} tasks")
    scorer: str = Field(
        "contains",
        description="exact | contains (the task's `answer` column) | pkg.module:function",
    )
    max_drop: float = Field(
        0.0,
        ge=0.0,
        description="mean score drop allowed: the candidate must show its lower confidence "
        "bound of the change is at least -max_drop",
    )

    @field_validator("scorer")
    @classmethod
    def _scorer(cls, v: str) -> str:
        if v not in ("exact", "contains") and not DOTTED.fullmatch(v):
            raise ValueError("scorer must be exact, contains or a dotted path pkg.module:func")
        return v


class GateSettings(Section):
    """gate: when a candidate may replace the head (reef.gate)."""

    policy: Literal["always", "improve", "manual"] = Field(
        "improve",
        description="always: every candidate that passes the guards; improve: one that beats "
        "the head on the evaluation samples by a paired test; manual: an operator approves",
    )
    margin: float = Field(0.0, description="improve: least mean improvement per eval sample")
    confidence: float = Field(0.9, gt=0.5, lt=1.0, description="improve: paired test confidence")
    test: Literal["bootstrap", "sign"] = Field(
        "bootstrap", description="improve: the paired test, a bootstrap of the mean or a sign test"
    )
    bootstrap_samples: int = Field(2000, ge=100, description="bootstrap: resamples drawn")
    holdout: float = Field(
        0.25,
        ge=0.0,
        lt=1.0,
        description="share of reported samples that are evaluation samples (chosen by a hash "
        "of their content, for good): never trained on, pooled across rounds for the gate",
    )
    pool_max: int = Field(
        64, ge=1, description="most evaluation samples the gate scores, the newest first"
    )
    pool_max_age_s: float = Field(
        14 * 24 * 3600.0,
        gt=0,
        description="evaluation samples older than this (by their record's time) leave the pool",
    )
    eval_dataset: Path | None = Field(
        None, description="JSONL of {messages, ...} tasks scored by `scorer` instead of held-out"
    )
    scorer: str | None = Field(
        None, description="pkg.module:function scoring answers to eval_dataset; default: recipe's"
    )
    max_tokens: int = Field(64, ge=1, description="eval_dataset: tokens generated per answer")
    approval_timeout_s: float = Field(
        7 * 24 * 3600.0, gt=0, description="manual: how long a pending candidate waits"
    )
    guards: tuple[GuardSettings, ...] = Field(
        (), description="task sets a candidate must not break, whatever the policy"
    )

    @field_validator("guards")
    @classmethod
    def _unique_guards(cls, v: tuple[GuardSettings, ...]) -> tuple[GuardSettings, ...]:
        names = [g.name for g in v]
        if len(set(names)) != len(names):
            raise ValueError(f"guard names must be unique, got {names}")
        return v
