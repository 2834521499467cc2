"""GRPO: online RL on the scenario's own requests, rewarded by a verifier scorer.

Group Relative Policy Optimization (Shao et al. 2024, DeepSeekMath,
https://arxiv.org/abs/2402.03300) through TRL's GRPOTrainer: for each recorded request the
policy samples `num_generations` answers, the verifier (`reward`, a dotted path to a function
`(completions, **kwargs) -> list[float]`) scores them, and each answer is pushed up or down
by how it compares with its group. Only the requests are taken from the records; the recorded
answers and their scores are not trained on (the verifier replaces them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reef.errors import ConfigError
from reef.recipe import (
    Progress,
    ReportContract,
    Scorer,
    Trained,
    TrainJob,
    WeightsRecipe,
    import_object,
)
from reef.recipes.params import TRLParams

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class GRPOParams(TRLParams):
    """Defaults are TRL's GRPOConfig (epsilon 0.2 as in the paper, beta 0.0: no KL penalty,
    as DAPO and Dr. GRPO found it unneeded, and no reference model to hold; loss "dapo";
    temperature 1.0) except where a CPU needs smaller: 4 answers per prompt (TRL 8, the
    paper 64) and 32 answer tokens (TRL 512), which is enough to judge a short-answer task.
    The learning rates are TRLParams' (1e-5 with LoRA, 1e-6 full)."""

    reward: str = "reef.recipes.scorers:at_most_five_words"
    num_generations: int = 4
    max_completion_length: int = 32
    temperature: float = 1.0
    beta: float = 0.0
    epsilon: float = 0.2
    loss_type: str = "dapo"
    # batch_size (answers per optimizer step) must hold whole groups: a multiple of
    # num_generations, with gradient_accumulation_steps.

    def __post_init__(self) -> None:
        if self.num_generations < 2:
            raise ValueError("num_generations must be >= 2 (GRPO compares answers in a group)")
        per_generation = self.batch_size * self.gradient_accumulation_steps
        if per_generation % self.num_generations:
            raise ValueError(
                f"batch_size * gradient_accumulation_steps ({per_generation}) must be a multiple "
                f"of num_generations ({self.num_generations})"
            )


class GRPORecipe(WeightsRecipe):
    name = "grpo"
    kind = "scored"
    # The rows only lend their requests; the verifier scores the answers, so any score will do.
    contract = ReportContract(score=True)
    Params = GRPOParams

    def scorer(self) -> Scorer:
        scorer: Scorer = import_object(self.params.reward, "grpo reward")
        if not callable(scorer):
            raise ConfigError(f"grpo reward '{self.params.reward}' is not a function")
        return scorer

    def rows(self, table: pa.Table) -> tuple[list[dict[str, Any]], list[str]]:
        """(one TRL conversational prompt row per distinct request, the sample ids behind
        them). A row carries `correction` (a report's corrected answer, or None) for verifiers
        that check against it."""
        from reef.recipes.training import chat_messages, correction

        prompts: dict[str, dict[str, Any]] = {}
        ids = []
        for r in table.select(["sample_id", "messages", "feedback"]).to_pylist():
            ids.append(r["sample_id"])
            row = prompts.setdefault(
                r["messages"], {"prompt": chat_messages(r["messages"]), "correction": None}
            )
            row["correction"] = row["correction"] or correction(r["feedback"])
        return list(prompts.values()), ids

    def train(self, job: TrainJob, progress: Progress | None = None) -> Trained:
        from datasets import Dataset
        from peft import PeftModel
        from trl import GRPOConfig, GRPOTrainer

        from reef.recipes.training import (
            NothingToTrain,
            fit,
            load_policy,
            lora_from,
            progress_callback,
            run_args,
        )

        p: GRPOParams = self.params
        reward = self.scorer()  # a bad dotted path fails before the model loads
        rows, ids = self.rows(job.dataset)
        if not rows:
            raise NothingToTrain("grpo: the snapshot has no requests to sample answers for")
        lora = lora_from(p)
        model, tokenizer = load_policy(job, lora)
        args = GRPOConfig(
            **run_args(
                p,
                job,
                lora,
                num_generations=p.num_generations,
                max_completion_length=p.max_completion_length,
                temperature=p.temperature,
                beta=p.beta,
                epsilon=p.epsilon,
                loss_type=p.loss_type,
            )
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,  # type: ignore[arg-type]  # a float per completion fits
            args=args,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
            callbacks=[progress_callback(progress)],
        )
        if trainer.ref_model is not None and not isinstance(model, PeftModel):
            # TRL reloads the reference from the config's path: the bare base when the head
            # was an adapter merged in here. The reference is the policy we start from.
            trainer.ref_model.load_state_dict(model.state_dict())
        return fit(trainer, tokenizer, job, ids, {"train_prompts": float(len(rows))})
