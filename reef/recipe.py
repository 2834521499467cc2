"""The recipe interface: what a learning method declares (experience kind, report contract,
hyper-parameters, scorer), how it trains a candidate, and how one is chosen by name.

A recipe is a small class in `recipes/` (or any importable module) chosen by `reef.recipe`:
a short name from RECIPES or a dotted path `pkg.module:Class`. Recipe modules import TRL and
torch inside `train`, so choosing and validating a recipe stays cheap in the API process.
Training itself never runs there: the evolve flow runs it in a worker process.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import types
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from reef.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

    from reef.records import Report
    from reef.samples import Kind

# Short names of the built-in recipes: one literal dict, no registry magic.
RECIPES: dict[str, str] = {
    "sft": "reef.recipes.sft:SFTRecipe",
    "kto": "reef.recipes.kto:KTORecipe",
    "dpo": "reef.recipes.dpo:DPORecipe",
    "sao": "reef.recipes.sao.recipe:SAORecipe",
    "grpo": "reef.recipes.grpo:GRPORecipe",
    "harness": "reef.recipes.harness.recipe:HarnessRecipe",
    "tttd": "reef.recipes.tttd.recipe:TTTDRecipe",
    "openclaw": "reef.recipes.openclaw.recipe:OpenClawRecipe",
    "composite": "reef.recipes.composite.recipe:CompositeRecipe",
}

# A scorer (reward function) as TRL takes them: completions plus the dataset's other columns
# as keyword arguments (prompts, answers, ...), one float per completion.
Scorer = Callable[..., list[float]]

# Progress callback a recipe calls as it trains: (step, total_steps, metrics so far).
Progress = Callable[[int, int, Mapping[str, float]], None]

ReleaseKind = Literal["adapter", "checkpoint"]
# What a recipe's candidates change: the weights, the harness, or both (recipes.composite).
Target = Literal["weights", "harness", "composite"]


@dataclass(frozen=True)
class ReportContract:
    """What the reports a recipe learns from must carry; `check` says why one does not."""

    score: bool = True  # the counted report has a score
    score_range: tuple[float, float] | None = None  # inclusive bounds when the score matters
    single_receipt: bool = False  # the report quotes exactly one receipt (one rollout)
    feedback_keys: tuple[str, ...] = ()  # keys a structured feedback object may use

    def check(self, report: Report) -> str | None:
        if self.score and report.score is None:
            return "the report has no score"
        if self.score_range is not None and report.score is not None:
            lo, hi = self.score_range
            if not lo <= report.score <= hi:
                return f"score {report.score} is outside [{lo}, {hi}]"
        if self.single_receipt and len(report.references) != 1:
            return f"the report quotes {len(report.references)} receipts; this recipe needs one"
        return None

    def describe(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Selection:
    """Which of a snapshot's eligible rows an evolve run trains on (`Recipe.select`).

    `rows` train; `discard` are consumed without training (they can never train); `waiting`
    says why nothing trains yet (then nothing is consumed and the run ends "not_ready");
    `whole`: the rows train as one unit, so none is held out for the gate.
    """

    rows: tuple[dict[str, Any], ...] = ()
    discard: tuple[dict[str, Any], ...] = ()
    waiting: str | None = None
    whole: bool = False


@dataclass(frozen=True)
class TrainJob:
    """Everything `Recipe.train` needs, on local disk.

    `parent_path` holds the head release's files: an adapter directory (PEFT format) when
    `parent_kind` is "adapter", a full Hugging Face model directory for "checkpoint", None for
    the base. A recipe continues from the parent, so releases build on each other.
    """

    scenario: str
    base_model: Path
    dataset: pa.Table  # the validated snapshot's training rows, in its kind's schema
    out_dir: Path  # write the candidate's files here (adapter or full model dir)
    parent_kind: Literal["base", "adapter", "checkpoint"] = "base"
    parent_path: Path | None = None
    seed: int = 0


@dataclass(frozen=True)
class Trained:
    """What training produced: files in `path` and what to log about them."""

    kind: ReleaseKind
    path: Path
    metrics: dict[str, float] = field(default_factory=dict)
    trained_sample_ids: tuple[str, ...] = ()
    # Joins the release's metadata (small JSON: what an operator reads on the release, e.g.
    # tttd's best program and its verified score); metrics stay numbers.
    metadata: dict[str, Any] = field(default_factory=dict)


class Recipe:
    """A learning method: what it learns from and what its candidates change.

    Subclasses set the class attributes; a weights recipe subclasses `WeightsRecipe` and
    implements `train`, a harness recipe (recipes.harness) sets `target = "harness"` and
    searches instead. `Params` is a frozen dataclass of hyper-parameters, defaults from the
    method's paper; `reef.params` in the YAML overrides fields by name (`from_config`).
    """

    name: ClassVar[str]
    kind: ClassVar[Kind]  # the experience it takes (reef.samples)
    # What a candidate changes: the weights (WeightsRecipe.train), the harness, or both (a
    # composite recipe runs a harness step and a weights step: recipes.composite).
    target: ClassVar[Target]
    contract: ClassVar[ReportContract] = ReportContract()
    Params: ClassVar[type[Any]]
    # Which report counts when several quote the same receipts (reef.experience.pick).
    report_rule: ClassVar[Literal["latest", "first", "mean"]] = "latest"
    # The gate policy its candidates get when the configuration sets no `gate.policy`.
    default_gate: ClassVar[Literal["always", "improve", "manual"] | None] = None

    def __init__(self, params: Any = None):
        self.params = params if params is not None else self.Params()

    @classmethod
    def from_config(cls, overrides: Mapping[str, Any] | None = None) -> Recipe:
        return cls(params_from(cls.Params, overrides or {}, where=f"recipe {cls.name}"))

    def select(self, rows: list[dict[str, Any]]) -> Selection:
        """The rows of a materialized snapshot this run trains on. Default: all of them (the
        loop's `batch_size` is the only barrier); a recipe with its own batching (tttd's step
        grid) picks its batch here, before anything trains or is consumed."""
        return Selection(rows=tuple(rows))

    def scorer(self) -> Scorer | None:
        """The function that scores a generated answer on this recipe's task (a verifier), or
        None: then candidates are compared on held-out reported samples (reef.evaluation)."""
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "recipe": self.name,
            "kind": self.kind,
            "contract": self.contract.describe(),
            "params": dataclasses.asdict(self.params),
        }


class WeightsRecipe(Recipe, ABC):
    """A recipe whose candidates are new weights (an adapter or a checkpoint)."""

    target: ClassVar[Target] = "weights"
    # Whether `train` may run in every rank of `accelerate launch` (reef.train.processes > 1,
    # recipes.distributed): a transformers Trainer that shards the batch and averages the
    # gradients (DDP), saving through recipes.training.fit on rank 0. A hand-written loop
    # (sao, openclaw, tttd) would train N copies on the same rows, so it stays False.
    distributed: ClassVar[bool] = False

    @abstractmethod
    def train(self, job: TrainJob, progress: Progress | None = None) -> Trained:
        """Train a candidate on `job.dataset`, continuing from the parent; write it to
        `job.out_dir`. Runs in a worker process, never in the API process."""


# Reef's layers as configs named them before they were one import package (`recipes.sft:...`
# for `reef.recipes.sft:...`): such a path still finds Reef's module when Reef has it.
_LAYERS = ("api", "cli", "deploy", "flows", "recipes")


def import_object(path: str, what: str) -> Any:
    """`pkg.module:attr` -> the attribute; ConfigError naming `what` when it is not there."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"{what} '{path}' must be a dotted path pkg.module:Name")
    if module_name.split(".")[0] in _LAYERS:
        try:
            if importlib.util.find_spec(f"reef.{module_name}") is not None:
                module_name = f"reef.{module_name}"
        except ImportError:
            pass  # reef.recipes has no such subpackage: the user's own package, as written
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"{what} '{path}': cannot import {module_name}: {e}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"{what} '{path}': {module_name} has no {attr}") from None


def recipe_class(name: str) -> type[Recipe]:
    """The recipe class for a short name or dotted path."""
    cls = import_object(RECIPES.get(name, name), "recipe")
    if not (isinstance(cls, type) and issubclass(cls, Recipe)):
        raise ConfigError(f"recipe '{name}' is not a reef.recipe.Recipe subclass")
    if getattr(cls, "target", None) not in typing.get_args(Target):
        raise ConfigError(f"recipe '{name}' sets no target: subclass reef.recipe.WeightsRecipe")
    return cls


def evolves_with(engine_kind: str, recipe: str) -> bool:
    """Whether `recipe` can evolve a scenario served by this kind of engine: weights need an
    engine whose weights Reef has (embedded, vLLM); a harness recipe works with any engine."""
    return engine_kind != "upstream" or recipe_class(recipe).target == "harness"


def distributed_refusal(cls: type[Recipe], processes: int) -> str | None:
    """Why recipe class `cls` cannot train in `processes` processes, or None when it can."""
    if processes <= 1 or getattr(cls, "distributed", False):
        return None
    able = ", ".join(
        short
        for short, path in RECIPES.items()
        if getattr(recipe_class(path), "distributed", False)
    )
    return (
        f"recipe '{cls.name}' trains in one process: reef.train.processes {processes} needs a "
        f"recipe that trains under accelerate launch ({able}); set reef.train.processes: 1"
    )


def load_recipe(name: str, params: Mapping[str, Any] | None = None) -> Recipe:
    return recipe_class(name).from_config(params)


def params_from(cls: type[Any], overrides: Mapping[str, Any], *, where: str) -> Any:
    """An instance of the dataclass `cls` with `overrides` applied; every unknown key or
    value of the wrong type is a ConfigError that names it."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ConfigError(
            f"{where}: unknown parameter(s) {', '.join(unknown)}; known: {', '.join(fields)}"
        )
    hints = typing.get_type_hints(cls)
    values = {}
    for key, value in overrides.items():
        values[key] = _coerce(value, hints[key], f"{where}: parameter '{key}'")
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """YAML gives ints for floats and lists for tuples; accept those, refuse the rest."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(value, option, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where}: {value!r} is not a {hint}")
    if origin is Literal:
        if value not in typing.get_args(hint):
            raise ConfigError(f"{where}: {value!r} is not one of {typing.get_args(hint)}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: {value!r} is not a list")
        return tuple(value) if origin is tuple else list(value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(hint, type) and not isinstance(value, hint):
        raise ConfigError(f"{where}: {value!r} is not a {hint.__name__}")
    if isinstance(value, bool) and hint is int:
        raise ConfigError(f"{where}: {value!r} is not an int")
    return value
