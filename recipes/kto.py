"""KTO: learn from unpaired thumbs-up/thumbs-down, each scored answer on its own.

An answer whose score reaches `threshold` is desirable, the rest undesirable (Kahneman-Tversky
Optimization, Ethayarajh et al. 2024, https://arxiv.org/abs/2402.01306, through TRL's
KTOTrainer). A report's correction (`{"correction": "..."}` feedback) adds the corrected text
as one more desirable answer to that prompt. Scores alone usually bring few positives, so by
default the desirable loss is weighted up to balance them (the paper's Eq. 8).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reef.recipe import Progress, ReportContract, Trained, TrainJob, WeightsRecipe
from reef.recipes.params import TRLParams

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class KTOParams(TRLParams):
    """beta 0.1 and the 1:1 weights are the paper's and TRL's defaults; the learning rates are
    TRLParams' (1e-5 with LoRA, 1e-6 full). `batch_size` must be > 1: KTO estimates its KL
    term from mismatched pairs in a batch.

    Not changed for score-only feedback, on evidence (bench/score_only.py, SmolLM2 + LoRA, 10
    rounds of 8 thumbs): 1e-5 left the held-out rate where it was (25 %); 1e-4 raised it to
    75 % while the answers still right fell from 62 % to 12 %. Thumbs alone: openclaw, mode rl.
    """

    threshold: float = 0.5  # scores are on [0, 1]; >= threshold is desirable
    use_corrections: bool = True
    beta: float = 0.1
    # None: balance the classes, lambda_D * n_D == lambda_U * n_U (Eq. 8 asks for a ratio in
    # [1, 4/3]); a number fixes the weight.
    desirable_weight: float | None = None
    undesirable_weight: float = 1.0
    max_length: int = 1024  # TRL's default


class KTORecipe(WeightsRecipe):
    name = "kto"
    kind = "scored"
    contract = ReportContract(score=True, score_range=(0.0, 1.0), feedback_keys=("correction",))
    Params = KTOParams
    distributed = True  # a TRL Trainer: DDP under accelerate launch

    def rows(self, table: pa.Table, seed: int = 0) -> tuple[list[dict[str, Any]], list[str]]:
        """(TRL unpaired conversational rows with a boolean `label`, the sample ids used).

        Shuffled with the seed: KTO reads its batches in order (the KL estimate pairs each
        prompt with a neighbour's answer), so one batch should not hold a single class."""
        from reef.recipes.training import chat_messages, correction

        p: KTOParams = self.params
        rows, ids = [], []
        for r in table.select(
            ["sample_id", "messages", "completion", "score", "feedback"]
        ).to_pylist():
            prompt = chat_messages(r["messages"])
            fixed = correction(r["feedback"]) if p.use_corrections else None
            good = r["score"] >= p.threshold
            if fixed is not None and fixed != r["completion"]:
                rows.append(_row(prompt, fixed, True))
            rows.append(_row(prompt, r["completion"], good))
            ids.append(r["sample_id"])
        random.Random(seed).shuffle(rows)
        return rows, ids

    def train(self, job: TrainJob, progress: Progress | None = None) -> Trained:
        from datasets import Dataset
        from trl import KTOConfig, KTOTrainer

        from reef.recipes.training import (
            NothingToTrain,
            fit,
            load_policy,
            lora_from,
            progress_callback,
            reference_model,
            run_args,
        )

        p: KTOParams = self.params
        rows, ids = self.rows(job.dataset, job.seed)
        if len(rows) < 2:
            raise NothingToTrain(
                f"kto needs at least 2 scored answers; the snapshot has {len(rows)}"
            )
        n_good = sum(r["label"] for r in rows)
        n_bad = len(rows) - n_good
        desirable_weight = p.desirable_weight
        if desirable_weight is None:
            desirable_weight = n_bad / n_good if n_good and n_bad else 1.0
        lora = lora_from(p)
        model, tokenizer = load_policy(job, lora)
        args = KTOConfig(
            **run_args(
                p,
                job,
                lora,
                max_length=p.max_length,
                beta=p.beta,
                desirable_weight=desirable_weight,
                undesirable_weight=p.undesirable_weight,
            )
        )
        trainer = KTOTrainer(
            model=model,
            ref_model=reference_model(model),
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            callbacks=[progress_callback(progress)],
        )
        counts = {
            "train_desirable": float(n_good),
            "train_undesirable": float(n_bad),
            "train_desirable_weight": float(desirable_weight),
        }
        return fit(trainer, tokenizer, job, ids, counts)


def _row(prompt: list[dict[str, Any]], answer: str, label: bool) -> dict[str, Any]:
    return {
        "prompt": prompt,
        "completion": [{"role": "assistant", "content": answer}],
        "label": label,
    }
