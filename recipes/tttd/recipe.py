"""The TTT-Discover recipe: one optimizer step per full step grid of scored rollouts.

Per evolve run (the TTT-Discover paper): the barrier (recipes.tttd.grid) picks the lowest full
G × R grid; groups whose rewards are all equal are removed (all constant: the first is kept
for a well-defined zero-signal step); each remaining group gets an adaptive β (KL of the tilted
group to uniform = ln 2) and leave-one-out entropic advantages; the per-token advantages are
shaped towards the frozen base (adapters disabled) by centred KL; the loss is the un-clipped
token-sum importance-sampling loss against the engine's recorded log-probs; one Adam step.

The candidate is a LoRA adapter, with the Adam state (`tttd/optimizer.pt`, so the next step
continues the same optimizer) and the best program found so far (`tttd/best.json`,
`tttd/best.py`, carried from release to release). The gate is `always` unless configured:
a discovery step is judged by the archive's best verified score, which only grows, not by a
held-out comparison (a step's rollouts are one problem's attempts, none is "held out").

This module does not import torch: choosing and validating the recipe stays cheap.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from reef.errors import ReefError
from reef.recipe import Progress, ReportContract, Selection, Trained, TrainJob, WeightsRecipe
from reef.recipes.tttd.grid import select
from reef.recipes.tttd.params import TTTDParams


class TTTDRecipe(WeightsRecipe):
    name = "tttd"
    kind = "rollout"
    # One finite score per rollout (invalid programs: 0), quoting that rollout's receipt.
    contract = ReportContract(score=True, single_receipt=True)
    Params = TTTDParams
    # Retries are terminal: the first report on a receipt counts, as at a grid slot.
    report_rule: ClassVar[Literal["latest", "first", "mean"]] = "first"
    default_gate: ClassVar[Literal["always", "improve", "manual"] | None] = "always"

    def select(self, rows: list[dict[str, Any]]) -> Selection:
        p: TTTDParams = self.params
        batch = select(rows, p.groups_per_step, p.rollouts_per_group)
        return Selection(batch.rows, batch.discard, batch.waiting, whole=True)

    def train(self, job: TrainJob, progress: Progress | None = None) -> Trained:
        from reef.recipes.tttd.learner import train_grid

        p: TTTDParams = self.params
        batch = select(job.dataset.to_pylist(), p.groups_per_step, p.rollouts_per_group)
        if batch.step is None:
            raise ReefError(f"tttd: {batch.waiting}", code="grid_incomplete")
        return train_grid(job, p, batch.step, list(batch.rows), progress)
