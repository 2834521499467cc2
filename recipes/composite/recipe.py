"""The composite recipe: evolve the whole agent in one run, a harness step and a weights step
in a configured order, each judged by its own gate.

    reef:
      recipe: composite
      params:
        order: [harness, weights]          # or [weights, harness]
        harness: {recipe: harness, params: {...}, gate: {...}}
        weights: {recipe: sft, params: {...}, gate: {...}}

Each step names a recipe of its target (`harness`: a harness recipe; `weights`: a weights
recipe learning from the same `scored` samples), that recipe's `params` (checked as that
recipe checks them) and optionally a `gate` over the configuration's `gate:` for that step
only. The evolve flow (flows.composite) runs the steps on one batch and publishes one release
of the steps the gates passed. This module only declares and checks: it imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from reef.errors import ConfigError
from reef.recipe import Recipe, ReportContract, Target, params_from, recipe_class

WHERE = "recipe composite"
STEPS = ("harness", "weights")
STEP_KEYS = ("recipe", "params", "gate")
DEFAULT_RECIPE = {"harness": "harness", "weights": "sft"}


@dataclass(frozen=True)
class Step:
    """One step of a composite run: its name (harness | weights), its recipe with its params,
    and the gate keys it sets over the configuration's `gate:`."""

    name: Literal["harness", "weights"]
    recipe: Recipe
    gate: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CompositeParams:
    order: tuple[str, ...] = ("harness", "weights")
    harness: dict[str, Any] = field(default_factory=lambda: {"recipe": "harness"})
    weights: dict[str, Any] = field(default_factory=lambda: {"recipe": "sft"})

    def __post_init__(self) -> None:
        steps(self)  # every error at load time, naming its key


def _order(order: Any) -> tuple[str, ...]:
    if not isinstance(order, (list, tuple)) or sorted(order) != sorted(STEPS):
        raise ConfigError(
            f"{WHERE}: parameter 'order' must name harness and weights once each "
            f"([harness, weights] or [weights, harness]); got {order!r}"
        )
    return tuple(order)


def _step(name: Literal["harness", "weights"], spec: Any) -> Step:
    where = f"{WHERE}: params.{name}"
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where} must be a mapping with keys {', '.join(STEP_KEYS)}")
    unknown = sorted(set(spec) - set(STEP_KEYS))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(map(str, unknown))}; known: {', '.join(STEP_KEYS)}"
        )
    short = spec.get("recipe") or DEFAULT_RECIPE[name]
    if not isinstance(short, str):
        raise ConfigError(f"{where}.recipe must be a recipe name, got {short!r}")
    try:
        cls = recipe_class(short)
    except ConfigError as e:
        raise ConfigError(f"{where}.recipe: {e.message}") from None
    if cls.target != name:
        raise ConfigError(
            f"{where}.recipe '{short}' evolves the {cls.target}; the {name} step needs a "
            f"{name} recipe"
        )
    if cls.kind != CompositeRecipe.kind:
        raise ConfigError(
            f"{where}.recipe '{short}' learns from '{cls.kind}' samples; both steps train on "
            f"one batch of '{CompositeRecipe.kind}' samples"
        )
    params = spec.get("params") or {}
    if not isinstance(params, Mapping):
        raise ConfigError(f"{where}.params must be a mapping, got {params!r}")
    recipe = cls(params_from(cls.Params, params, where=f"{where}.params"))
    return Step(name, recipe, _gate(where, spec.get("gate") or {}))


def _gate(where: str, gate: Any) -> dict[str, Any]:
    """The step's gate keys, checked against the `gate:` section's model."""
    from pydantic import ValidationError

    from reef.settings.gate import GateSettings
    from reef.settings.section import describe

    if not isinstance(gate, Mapping):
        raise ConfigError(f"{where}.gate must be a mapping of gate: keys, got {gate!r}")
    try:
        GateSettings.model_validate(dict(gate))
    except ValidationError as e:
        raise ConfigError(f"{where}.gate: {describe(e)}") from None
    return dict(gate)


def steps(params: CompositeParams) -> list[Step]:
    """The steps in their order (ConfigError naming the key that is wrong)."""
    made = {
        "harness": _step("harness", params.harness),
        "weights": _step("weights", params.weights),
    }
    return [made[name] for name in _order(params.order)]


class CompositeRecipe(Recipe):
    """A harness step and a weights step on one batch; their gates decide what is released."""

    name = "composite"
    kind = "scored"
    target: ClassVar[Target] = "composite"
    # the stricter of its steps' contracts (sft's): scores on [0, 1], corrections as feedback
    contract = ReportContract(score=True, score_range=(0.0, 1.0), feedback_keys=("correction",))
    Params = CompositeParams

    def __init__(self, params: Any = None):
        super().__init__(params)
        self.steps = steps(self.params)

    def step(self, name: str) -> Step:
        return next(s for s in self.steps if s.name == name)

    def describe(self) -> dict[str, Any]:
        """Each step's recipe and params as flat keys (`harness.recipe`, `weights.epochs`):
        what MLflow's run parameters name."""
        params: dict[str, Any] = {"order": ",".join(self.params.order)}
        for s in self.steps:
            params[f"{s.name}.recipe"] = s.recipe.name
            params |= {f"{s.name}.{k}": v for k, v in s.recipe.describe()["params"].items()}
            params |= {f"{s.name}.gate.{k}": v for k, v in s.gate.items()}
        return {**super().describe(), "params": params}
