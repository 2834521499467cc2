"""reef: the learning loop's keys (recipe, batch size, staleness, training processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from reef.recipe import RECIPES, distributed_refusal, recipe_class
from reef.records import Slice
from reef.settings.section import DOTTED, Section


class TrainSettings(Section):
    """reef.train: how a weights recipe's training runs on the worker host (recipes.distributed)."""

    processes: int = Field(
        1,
        ge=1,
        description="training processes on the worker host; > 1 runs the recipe under "
        "`accelerate launch` with DDP (gloo on CPU, NCCL on GPUs): sft, kto, dpo",
    )
    accelerate_config: Path | None = Field(
        None,
        description="an `accelerate config` YAML (multi-GPU, FSDP, DeepSpeed) on the worker "
        "host, for processes > 1; None: plain DDP over the host's GPUs, or its CPU",
    )


class SelectSettings(Section):
    """reef.select: the slice of a scenario's traffic the recipe learns from (one agent or role
    of a multi-agent app, one user): records outside it are never samples."""

    tags: dict[str, str] = Field(
        default_factory=dict,
        description="tags every record of a sample must carry with these values (set per call "
        "with `x-reef-tag-<name>: <value>` headers), e.g. {role: planner}; samples with a "
        "record outside are dropped as not_selected; empty: every record",
    )
    sessions: list[str] = Field(
        default_factory=list,
        description="sessions every record of a sample must belong to (a record's session: "
        "the x-reef-session-id header, or the conversation Reef found it continues), e.g. one "
        "agent's run; empty: every session",
    )
    users: list[str] = Field(
        default_factory=list,
        description="end users every record of a sample must have been served to (the "
        "x-reef-user-id header, recorded as the tag reef.user); empty: every user",
    )

    def slice(self) -> Slice:
        """The slice as the experience reads it (reef.records.Slice)."""
        return Slice(dict(self.tags), tuple(self.sessions), tuple(self.users))


class LoopSettings(Section):
    """reef: the learning loop's keys: the recipe, when an evolve run starts, where its
    releases are deployed, and how training runs."""

    recipe: str = Field(
        "sft",
        description="how experience becomes a release: sft | kto | dpo | sao | grpo | openclaw "
        "| harness | tttd | composite, or pkg.module:Class",
    )
    batch_size: int = Field(
        32, ge=1, description="eligible samples of a scenario that start an evolve run"
    )
    max_staleness: int = Field(0, ge=0, description="releases behind the head a sample may be")
    params: dict[str, Any] = Field(
        default_factory=dict, description="the recipe's hyper-parameters, overriding its defaults"
    )
    auto: bool = Field(
        True, description="start the evolve flow when a scenario has batch_size eligible samples"
    )
    engine_url: str | None = Field(
        None,
        description="admin URL of the serving engine that deploys go to; default: this server",
    )
    engine_token: SecretStr | None = Field(
        None,
        description="admin token deploys send to engine_url / engine.admin_urls, which reef "
        "serve also accepts on its admin routes (unset: it makes one for its worker)",
    )
    schedule_s: float | None = Field(
        None,
        gt=0,
        description="also check every scenario for a ready batch this often, and finish what "
        "runs that died or failed left (a candidate on the chain still pending, MLflow's "
        "champion alias off the head)",
    )
    train_threads: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field(
        "auto",
        description="torch threads for training and evaluation: a count, `auto` (before "
        "every step, the cores the rest of the machine left idle during the last one: all "
        "of them while nothing is served, one while the engine answers; Linux /proc/stat, "
        "machine-wide, so a container on a busy host takes one), or None (torch's default)",
    )
    worker_priority: Literal["idle", "low", "normal"] = Field(
        "idle",
        description="CPU priority of the evolve worker `reef serve` starts and of what it "
        "starts (Prefect's temporary server, training), below the server's: idle (Linux "
        "SCHED_IDLE: it runs only on cycles nothing else wants, so its start-up imports and "
        "its training never slow the engine's answers, but a machine busy with other work "
        "starves it too), low (nice +10: a tenth of a contended core), normal (the server's)",
    )
    seed: int = Field(0, description="random seed of training and evaluation")
    train: TrainSettings = TrainSettings()
    select: SelectSettings = SelectSettings()
    metric: str = Field(
        "score",
        description="what the recipe learns from: `score` (a report's score) or a boolean or "
        "float metric the scenario declares (metrics.<name>; true counts 1, false 0)",
    )

    @field_validator("recipe")
    @classmethod
    def _recipe(cls, v: str) -> str:
        if v not in RECIPES and not DOTTED.fullmatch(v):
            names = ", ".join(sorted(RECIPES))
            raise ValueError(f"recipe must be one of {names} or a dotted path pkg.module:Class")
        return v

    @model_validator(mode="after")
    def _distributed(self) -> LoopSettings:
        """A recipe that cannot train in several processes is refused at start, not when its
        first batch is ready."""
        if self.train.processes > 1:
            refused = distributed_refusal(recipe_class(self.recipe), self.train.processes)
            if refused:
                raise ValueError(refused)
        return self
