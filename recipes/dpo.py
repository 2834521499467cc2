"""DPO: learn from pairs of answers to the same request, the better-scored one preferred.

Direct Preference Optimization (Rafailov et al. 2023, https://arxiv.org/abs/2305.18290)
through TRL's DPOTrainer: raise the policy's log-ratio to the reference on the chosen answer
over the rejected one. The reference is the policy the candidate starts from (the head).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reef.recipe import Progress, ReportContract, Trained, TrainJob, WeightsRecipe
from reef.recipes.params import TRLParams

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class DPOParams(TRLParams):
    """beta 0.1 and the sigmoid loss are the paper's and TRL's defaults; the learning rates are
    TRLParams' (1e-5 with LoRA, 1e-6 full)."""

    beta: float = 0.1
    loss_type: str = "sigmoid"  # any of TRL's DPOConfig.loss_type values ("ipo", "hinge", ...)
    # Pairs whose scores differ by no more than this are ties, not preferences.
    min_margin: float = 0.0
    max_length: int = 1024  # TRL's default


class DPORecipe(WeightsRecipe):
    name = "dpo"
    kind = "preference"
    contract = ReportContract(score=True)  # only the order of two scores matters
    Params = DPOParams
    distributed = True  # a TRL Trainer: DDP under accelerate launch

    def rows(self, table: pa.Table) -> tuple[list[dict[str, Any]], list[str]]:
        """(TRL conversational preference rows, their sample ids)."""
        from reef.recipes.training import chat_messages

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

        from reef.recipes.training import (
            NothingToTrain,
            fit,
            load_policy,
            lora_from,
            progress_callback,
            reference_model,
            run_args,
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
        args = DPOConfig(
            **run_args(p, job, lora, max_length=p.max_length, beta=p.beta, loss_type=[p.loss_type])
        )
        trainer = DPOTrainer(
            model=model,
            ref_model=reference_model(model),
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            callbacks=[progress_callback(progress)],
        )
        return fit(trainer, tokenizer, job, ids, {"train_pairs": float(len(rows))})
