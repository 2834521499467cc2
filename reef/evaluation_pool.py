"""The evaluation pool: a scenario's reported samples that the gate evaluates on and no recipe
ever trains on, gathered across rounds.

Membership. A sample is an evaluation sample when a hash of its content — the prompt and the
answer of its first exchange (a preference pair's chosen answer) — falls in the first
`gate.holdout` of the hash range. Nothing is stored: the same exchange lands on the same side
in every round and after every restart, whatever else arrived with it, and identical exchanges
(the same question answered the same way twice) land on the same side, so an answer the gate
scores was never a training example in another sample's clothes. Evolve trains on training
samples only and consumes only what it trained on, so evaluation samples stay unconsumed; a
sample a recipe consumed (trained on before, under another `gate.holdout`, or while nothing
was held out) never enters the pool. Raising `gate.holdout` moves some training samples into
evaluation; lowering it hands some evaluation samples to training.

The pool. The gate scores the candidate and the head on the scenario's evaluation samples
with feedback, collected with no staleness limit (a question answered under an older release
is still a fair question for both models), the newest first by their newest record's time, at
most `gate.pool_max` of them and none older than `gate.pool_max_age_s`. So the evidence grows
across rounds up to the cap and follows the traffic as it changes, instead of the few samples
one batch would hold out.

Readiness. `reef.batch_size` counts training samples: evaluation samples never count toward a
batch (readiness reports them among the dropped, as "held_out"). Counting them would let a
gate that keeps rejecting pile up evaluation samples until they alone made a "batch" with
nothing to train on.

Nothing is held out under policy "always" (the recipe's default gate included), with
`gate.eval_dataset` (the gate scores that task set instead), or for a recipe whose selection
trains as one unit (`Selection.whole`, decided by the evolve flow).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from reef.experience import Experience, dumps
from reef.records import id_time, utcnow
from reef.samples import PreferenceSample, Sample, TrajectorySample

if TYPE_CHECKING:
    from reef.settings import Settings

Row = dict[str, Any]


def fraction(settings: Settings) -> float:
    """The share of samples held out for evaluation under these settings (0.0: none)."""
    from reef.recipe import recipe_class

    gate = settings.gate
    policy = gate.policy
    if "policy" not in gate.model_fields_set:
        policy = recipe_class(settings.reef.recipe).default_gate or policy
    if policy == "always" or gate.eval_dataset is not None:
        return 0.0
    return gate.holdout


def _in_share(content: str, share: float) -> bool:
    if share <= 0:
        return False
    digest = hashlib.sha256(content.encode()).digest()
    return int.from_bytes(digest[:8], "big") < share * 2**64


def _sample_content(sample: Sample) -> str:
    if isinstance(sample, TrajectorySample):
        first = sample.turns[0]
        return dumps(list(first.messages)) + first.completion
    if isinstance(sample, PreferenceSample):
        return dumps(list(sample.messages)) + sample.chosen
    return dumps(list(sample.messages)) + sample.completion


def _row_content(row: Row) -> str:
    # The same text as _sample_content: a row's messages are the sample's, as canonical JSON.
    if "turns" in row:
        first = row["turns"][0]
        return str(first["messages"]) + str(first["completion"])
    answer = row["chosen"] if "chosen" in row else row["completion"]
    return str(row["messages"]) + str(answer)


def held_out(sample: Sample, share: float) -> bool:
    """Whether `sample` is an evaluation sample when `share` of samples are."""
    return share > 0 and _in_share(_sample_content(sample), share)


def split(rows: Sequence[Row], share: float) -> tuple[list[Row], list[Row]]:
    """Dataset rows (reef.datasets) as (training rows, evaluation rows), in their order."""
    train: list[Row] = []
    evaluation: list[Row] = []
    for row in rows:
        (evaluation if share > 0 and _in_share(_row_content(row), share) else train).append(row)
    return train, evaluation


def _newest(sample: Sample) -> datetime | None:
    times = [t for t in map(id_time, sample.record_ids) if t is not None]
    return max(times) if times else None


def pool(
    experience: Experience,
    share: float,
    *,
    max_n: int,
    max_age_s: float,
    now: datetime | None = None,
) -> list[Row]:
    """The evaluation samples of `experience` (collect it with no staleness limit) as dataset
    rows: the newest first, at most `max_n`, none older than `max_age_s`. A sample whose
    record ids carry no time (not made by Reef) counts as the oldest, but stays."""
    from reef.datasets import row

    cutoff = (now or utcnow()) - timedelta(seconds=max_age_s)
    dated = [(s, _newest(s)) for s in experience.samples if held_out(s, share)]
    fresh = [(s, t) for s, t in dated if t is None or t >= cutoff]
    fresh.sort(key=lambda st: (st[1] is not None, st[1] or cutoff, st[0].sample_id), reverse=True)
    return [row(s, experience.scenario) for s, _ in fresh[:max_n]]


__all__ = ["fraction", "held_out", "pool", "split"]
