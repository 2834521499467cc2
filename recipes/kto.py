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

from reef.recipe import Progress, Recipe, ReportContract, Trained, TrainJob

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class KTOParams:
    """beta 0.1 and the 1:1 weights are the paper's and TRL's defaults; TRL's learning rate
    1e-6 is for full fine-tunes, and LoRA wants about ten times a full fine-tune's rate
    ("LoRA Without Regret", Schulman et al. 2025), hence 1e-5 with LoRA."""

    threshold: float = 0.5  # scores are on [0, 1]; >= threshold is desirable
    use_corrections: bool = True
    beta: float = 0.1
    # None: balance the classes, lambda_D * n_D == lambda_U * n_U (Eq. 8 asks for a ratio in
    # [1, 4/3]); a number fixes the weight.
    desirable_weight: float | None = None
    undesirable_weight: float = 1.0
    epochs: float = 3.0  # TrainingArguments' default
    batch_size: int = 4  # must be > 1: KTO estimates its KL term from mismatched pairs in a batch
    gradient_accumulation_steps: int = 1
    learning_rate: float | None = None  # None: 1e-5 with LoRA, 1e-6 full (TRL's default)
    max_length: int = 1024  # TRL's default
    max_steps: int = -1
    full: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: str = "all-linear"


LORA_LEARNING_RATE = 1e-5
FULL_LEARNING_RATE = 1e-6


class KTORecipe(Recipe):
    name = "kto"
    kind = "scored"
    contract = ReportContract(score=True, score_range=(0.0, 1.0), feedback_keys=("correction",))
    Params = KTOParams

    def rows(self, table: pa.Table, seed: int = 0) -> tuple[list[dict[str, Any]], list[str]]:
        """(TRL unpaired conversational rows with a boolean `label`, the sample ids used).

        Shuffled with the seed: KTO reads its batches in order (the KL estimate pairs each
        prompt with a neighbour's answer), so one batch should not hold a single class."""
        from recipes.training import chat_messages, correction

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

        from recipes.training import (
            NothingToTrain,
            drop_reference_adapter,
            final_metrics,
            load_policy,
            lora_from,
            progress_callback,
            reference_model,
            save_candidate,
            trl_args,
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
        lr = p.learning_rate
        if lr is None:
            lr = LORA_LEARNING_RATE if lora else FULL_LEARNING_RATE
        args = KTOConfig(
            **trl_args(
                job.out_dir,
                job.seed,
                num_train_epochs=p.epochs,
                max_steps=p.max_steps,
                per_device_train_batch_size=p.batch_size,
                gradient_accumulation_steps=p.gradient_accumulation_steps,
                learning_rate=lr,
                max_length=p.max_length,
                beta=p.beta,
                desirable_weight=desirable_weight,
                undesirable_weight=p.undesirable_weight,
                activation_checkpointing=False,
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
        trainer.train()
        drop_reference_adapter(trainer.model)
        kind = save_candidate(trainer.model, tokenizer, job)
        metrics = final_metrics(trainer.state.log_history) | {
            "train_desirable": float(n_good),
            "train_undesirable": float(n_bad),
            "train_desirable_weight": float(desirable_weight),
        }
        return Trained(kind, path=job.out_dir, metrics=metrics, trained_sample_ids=tuple(ids))


def _row(prompt: list[dict[str, Any]], answer: str, label: bool) -> dict[str, Any]:
    return {
        "prompt": prompt,
        "completion": [{"role": "assistant", "content": answer}],
        "label": label,
    }
