"""DPO: learn from pairs of answers to the same request, the better-scored one preferred.

Direct Preference Optimization (Rafailov et al. 2023, https://arxiv.org/abs/2305.18290)
through TRL's DPOTrainer: raise the policy's log-ratio to the reference on the chosen answer
over the rejected one. The reference is the policy the candidate starts from (the head).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reef.recipe import Progress, Recipe, ReportContract, Trained, TrainJob

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class DPOParams:
    """beta 0.1 and the sigmoid loss are the paper's and TRL's defaults; TRL's learning rate
    1e-6 is for full fine-tunes, and LoRA wants about ten times a full fine-tune's rate
    ("LoRA Without Regret", Schulman et al. 2025), hence 1e-5 with LoRA."""

    beta: float = 0.1
    loss_type: str = "sigmoid"  # any of TRL's DPOConfig.loss_type values ("ipo", "hinge", ...)
    # Pairs whose scores differ by no more than this are ties, not preferences.
    min_margin: float = 0.0
    epochs: float = 3.0  # TrainingArguments' default
    batch_size: int = 4
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


class DPORecipe(Recipe):
    name = "dpo"
    kind = "preference"
    contract = ReportContract(score=True)  # only the order of two scores matters
    Params = DPOParams

    def rows(self, table: pa.Table) -> tuple[list[dict[str, Any]], list[str]]:
        """(TRL conversational preference rows, their sample ids)."""
        from recipes.training import chat_messages

        p: DPOParams = self.params
        rows, ids = [], []
        columns = ["sample_id", "messages", "chosen", "rejected", "chosen_score", "rejected_score"]
        for r in table.select(columns).to_pylist():
            if (
                r["chosen_score"] - r["rejected_score"] <= p.min_margin
                or r["chosen"] == r["rejected"]
            ):
                continue
            rows.append(
                {
                    "prompt": chat_messages(r["messages"]),
                    "chosen": [{"role": "assistant", "content": r["chosen"]}],
                    "rejected": [{"role": "assistant", "content": r["rejected"]}],
                }
            )
            ids.append(r["sample_id"])
        return rows, ids

    def train(self, job: TrainJob, progress: Progress | None = None) -> Trained:
        from datasets import Dataset
        from trl import DPOConfig, DPOTrainer

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

        p: DPOParams = self.params
        rows, ids = self.rows(job.dataset)
        if not rows:
            raise NothingToTrain(
                f"dpo: none of the {job.dataset.num_rows} pairs has a chosen answer scored more "
                f"than {p.min_margin} above a different rejected one"
            )
        lora = lora_from(p)
        model, tokenizer = load_policy(job, lora)
        lr = p.learning_rate
        if lr is None:
            lr = LORA_LEARNING_RATE if lora else FULL_LEARNING_RATE
        args = DPOConfig(
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
                loss_type=[p.loss_type],
                activation_checkpointing=False,
            )
        )
        trainer = DPOTrainer(
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
        metrics = final_metrics(trainer.state.log_history) | {"train_pairs": float(len(rows))}
        return Trained(kind, path=job.out_dir, metrics=metrics, trained_sample_ids=tuple(ids))
