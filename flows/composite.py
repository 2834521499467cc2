"""The evolve flow's path for the composite recipe: a harness step and a weights step on one
batch, in the configured order, each judged by its own gate; one candidate of what passed.

- harness step: flows.harness.judge (search on the head's weights, paired episodes, gate).
- weights step: flows.weights.judge on the batch's rows rendered under the harness the
  weights will serve with: the harness step's when it ran first and passed, else the head's
  (its system text in each prompt, as the engine injects it). Both models the gate compares
  answer under that harness, on the held-out rows and on a configured task set
  (gate.eval_dataset) or guard alike, so the verdict is on what would serve.
- Each step has its settings' gate, with the step's own `gate` keys over it.

What is registered (one candidate, released by the flow's one release path): both passed,
the weights carrying the new harness; one passed, that one alone; neither, a rejected one.
The candidate's metadata (`composite`) and its MLflow tags (`reef.composite.*`) say which
step passed, and each step's verdict and reason; a step with nothing to learn from says so
and the other goes on alone.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reef.artifacts import artifacts_for
from reef.deploy.candidates import store_harness
from reef.errors import NothingToTrain
from reef.flows import harness, weights
from reef.flows.release import Registered, register_harness, register_weights
from reef.gate import Decision
from reef.harness import Harness
from reef.provenance import Provenance
from reef.recipe import WeightsRecipe
from reef.recipes.composite.recipe import CompositeRecipe, Step
from reef.recipes.harness.recipe import HarnessRecipe
from reef.records import Release
from reef.settings import Settings
from reef.settings.gate import GateSettings

PASSED = ("accepted", "pending")  # a pending step is released once a person approves it


@dataclass(frozen=True)
class Outcome:
    """What one step came to: its gate's status (or nothing_to_train), why, the numbers."""

    status: str  # accepted | pending | rejected | nothing_to_train
    reason: str
    gate: dict[str, Any] | None = None

    @property
    def passed(self) -> bool:
        return self.status in PASSED

    @classmethod
    def of(cls, decision: Decision) -> Outcome:
        return cls(decision.status, decision.reason, decision.as_dict())


@dataclass
class Steps:
    """The steps' results so far, in the order they ran."""

    order: tuple[str, ...]
    outcomes: dict[str, Outcome] = dataclasses.field(default_factory=dict)
    harness: harness.Judged | None = None
    weights: weights.Judged | None = None
    # the content hash of the harness the weights step's prompts were rendered with (None:
    # none with a system text)
    weights_under: str | None = None

    @property
    def passed(self) -> list[str]:
        return [n for n in self.order if n in self.outcomes and self.outcomes[n].passed]

    def summary(self) -> dict[str, Any]:
        """The candidate's `composite` metadata and the run's `steps` result."""
        return {
            "order": list(self.order),
            "released": self.passed,
            "steps": {n: dataclasses.asdict(o) for n, o in self.outcomes.items()},
            "weights_trained_under": self.weights_under,
        }

    def tags(self) -> dict[str, str]:
        """`reef.composite.*` tags of the model version and the run."""
        out = {"composite.parts": ",".join(self.passed) or "none"}
        for name, o in self.outcomes.items():
            out[f"composite.{name}.gate"] = o.status
            out[f"composite.{name}.reason"] = o.reason[:500]
        if self.harness is not None:
            out["composite.harness.content_hash"] = self.harness.harness.content_hash()
        return out


def step_settings(settings: Settings, step: Step) -> Settings:
    """The settings a step runs under: its own gate keys over the configuration's gate."""
    if not step.gate:
        return settings
    gate = GateSettings.model_validate({**settings.gate.model_dump(), **step.gate})
    return settings.model_copy(update={"gate": gate})


def rendered(rows: list[dict[str, Any]], under: Harness) -> list[dict[str, Any]]:
    """The rows with their prompts as `under` serves them (its system text injected)."""
    if not under.system_text():
        return rows
    return [{**r, "messages": json.dumps(under.inject(json.loads(r["messages"])))} for r in rows]


def candidate(
    settings: Settings,
    recipe: CompositeRecipe,
    model: Path,
    head: Release,
    snapshot: Any,
    train_rows: list[dict[str, Any]],
    held_out: list[dict[str, Any]],
    run_id: str,
) -> Registered:
    """Run the steps in order, each judged by its gate, and register one candidate of what
    passed (inside the flow's MLflow run). Raises NothingToTrain when neither step had
    anything to learn from."""
    import mlflow

    done = Steps(tuple(recipe.params.order))
    with tempfile.TemporaryDirectory(prefix="reef-composite-") as tmp:
        for step in recipe.steps:
            own = step_settings(settings, step)
            try:
                if step.name == "harness":
                    assert isinstance(step.recipe, HarnessRecipe)
                    done.harness = harness.judge(
                        own,
                        step.recipe,
                        head,
                        train_rows,
                        held_out,
                        snapshot.content_hash,
                        run_id,
                        "harness",
                    )
                    done.outcomes["harness"] = Outcome.of(done.harness.decision)
                    continue
                assert isinstance(step.recipe, WeightsRecipe)
                under = serves_with(settings, head, done)
                done.weights_under = under.content_hash() if under.system_text() else None
                done.weights = weights.judge(
                    own,
                    step.recipe,
                    model,
                    head,
                    snapshot,
                    rendered(train_rows, under),
                    rendered(held_out, under),
                    run_id,
                    Path(tmp),
                    "weights",
                    under,
                )
                done.outcomes["weights"] = Outcome.of(done.weights.decision)
            except NothingToTrain as e:
                done.outcomes[step.name] = Outcome("nothing_to_train", e.message)
        mlflow.set_tags({f"reef.{k}": v for k, v in done.tags().items()})
        if done.harness is None and done.weights is None:
            raise NothingToTrain("; ".join(f"{n}: {o.reason}" for n, o in done.outcomes.items()))
        registered = register(settings, head, done)
    verdict = registered.decision
    mlflow.set_tags({"reef.gate": verdict.status, "reef.gate_reason": verdict.reason[:5000]})
    return dataclasses.replace(registered, steps=done.summary())


def serves_with(settings: Settings, head: Release, done: Steps) -> Harness:
    """The harness the weights step's candidate would serve with: the harness step's, when
    it ran first and passed; else the head's."""
    if done.harness is not None and done.outcomes["harness"].passed:
        return done.harness.harness
    return harness.head_harness(settings, head)


def combined(done: Steps, primary: Decision) -> Decision:
    """The candidate's verdict: accepted when every step it carries was, pending when one of
    them waits for a person, rejected when no step passed; the reason names each step's."""
    passed = done.passed
    if not passed:
        status = "rejected"
    elif any(done.outcomes[n].status == "pending" for n in passed):
        status = "pending"
    else:
        status = "accepted"
    reasons = [f"{n} {o.status}: {o.reason}" for n, o in done.outcomes.items()]
    return dataclasses.replace(primary, status=status, reason="; ".join(reasons))  # type: ignore[arg-type]


def register(settings: Settings, head: Release, done: Steps) -> Registered:
    """One candidate: the weights (with the harness when both passed), or the harness alone
    when only it passed or no weights were trained."""
    passed = done.passed
    harness_alone = done.harness is not None and (
        done.weights is None or ("harness" in passed and "weights" not in passed)
    )
    if harness_alone:
        assert done.harness is not None
        made = _provenance(done.harness.provenance, done, "weights", done.weights)
        decision = combined(done, done.harness.decision)
        registered = register_harness(settings, head, done.harness.harness, decision, made)
        return dataclasses.replace(registered, guard_answers=done.harness.failed)
    assert done.weights is not None
    made = _provenance(done.weights.provenance, done, "harness", done.harness)
    if "harness" in passed:  # both passed: one release serves the new weights and harness
        ref = store_harness(artifacts_for(settings), head.scenario, done.harness.harness)  # type: ignore[union-attr]
        made = made.with_metadata({"harness": ref})
    trained = done.weights.trained
    decision = combined(done, done.weights.decision)
    registered = register_weights(settings, head, trained.path, trained.kind, decision, made)
    # the weights step's guard answers: its guards were answered by the weights registered
    return dataclasses.replace(registered, guard_answers=done.weights.failed)


def _provenance(own: Provenance, done: Steps, other: str, judged: Any) -> Provenance:
    """The registered part's provenance, made by the composite recipe: with the other step's
    metrics (`<step>.` prefixed), the steps' summary in its metadata and the
    `reef.composite.*` tags."""
    metrics = dict(own.metrics)
    if judged is not None:
        metrics |= {f"{other}.{k}": v for k, v in judged.provenance.metrics.items()}
    return dataclasses.replace(
        own.with_metadata({"composite": done.summary()}),
        recipe=CompositeRecipe.name,
        metrics=metrics,
        tags=done.tags(),
    )
