"""The composite recipe's configuration (each error names its key), how the weights step's
prompts are rendered under a harness, how the steps' verdicts combine into the candidate's,
and how the release page reads a composite release's parts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reef.api.ui.views.releases import parts
from reef.errors import ConfigError
from reef.flows.composite import Outcome, Steps, combined, rendered
from reef.gate import Decision
from reef.harness import Harness
from reef.recipe import load_recipe, recipe_class


def test_defaults_run_the_harness_then_sft() -> None:
    recipe = load_recipe("composite")
    assert recipe_class("composite").target == "composite" and recipe.kind == "scored"
    assert [(s.name, s.recipe.name) for s in recipe.steps] == [
        ("harness", "harness"),
        ("weights", "sft"),
    ]


def test_order_params_and_gates_per_step() -> None:
    recipe = load_recipe(
        "composite",
        {
            "order": ["weights", "harness"],
            "harness": {"params": {"repeats": 3}, "gate": {"policy": "always"}},
            "weights": {"recipe": "kto", "params": {"epochs": 2}, "gate": {"margin": 0.1}},
        },
    )
    assert [s.name for s in recipe.steps] == ["weights", "harness"]
    assert recipe.step("harness").recipe.params.repeats == 3
    assert recipe.step("weights").recipe.name == "kto"
    assert recipe.step("weights").gate == {"margin": 0.1}
    # MLflow's run parameters name each step's recipe, params and gate keys
    params = recipe.describe()["params"]
    assert params["order"] == "weights,harness" and params["weights.recipe"] == "kto"
    assert params["weights.epochs"] == 2.0 and params["harness.repeats"] == 3
    assert params["harness.gate.policy"] == "always"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"order": ["harness"]}, "parameter 'order' must name harness and weights once each"),
        ({"order": ["weights", "weights"]}, "parameter 'order' must name harness and weights"),
        ({"order": "harness"}, "parameter 'order'"),
        ({"steps": 2}, "recipe composite: unknown parameter(s) steps"),
        ({"weights": {"recipe": "sft", "lr": 1}}, "params.weights: unknown key(s) lr"),
        ({"weights": "sft"}, "params.weights must be a mapping"),
        ({"weights": {"recipe": "harness"}}, "params.weights.recipe 'harness' evolves the harness"),
        ({"harness": {"recipe": "sft"}}, "params.harness.recipe 'sft' evolves the weights"),
        ({"weights": {"recipe": "dpo"}}, "params.weights.recipe 'dpo' learns from 'preference'"),
        ({"weights": {"recipe": "nope"}}, "params.weights.recipe: recipe 'nope'"),
        ({"weights": {"recipe": "composite"}}, "'composite' evolves the composite"),
        (
            {"weights": {"params": {"epoch": 1}}},
            "params.weights.params: unknown parameter(s) epoch",
        ),
        ({"harness": {"params": {"repeats": "x"}}}, "params.harness.params: parameter 'repeats'"),
        ({"harness": {"gate": {"policy": "x"}}}, "params.harness.gate: policy"),
        ({"weights": {"gate": {"margn": 1}}}, "params.weights.gate: unknown key 'margn'"),
    ],
)
def test_a_bad_configuration_names_its_key(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_recipe("composite", params)
    assert message in e.value.message


def test_rendered_rows_carry_the_harness_system_text() -> None:
    rows = [{"sample_id": "s1", "messages": json.dumps([{"role": "user", "content": "hi"}])}]
    harness = Harness({"AGENTS.md": "Answer with the city only.\n"})
    got = json.loads(rendered(rows, harness)[0]["messages"])
    assert got[0]["role"] == "system" and "Answer with the city only." in got[0]["content"]
    assert got[1] == {"role": "user", "content": "hi"}
    assert rendered(rows, Harness.empty()) == rows  # no system text: the rows as they were


SEEN: list[list[dict[str, Any]]] = []  # the prompts `seen` scored


def seen(completions: list[str], prompts: list[Any], **_: Any) -> list[float]:
    """A gate scorer that keeps the prompts it was given."""
    SEEN.extend(prompts)
    return [0.0] * len(completions)


def test_the_weights_gate_answers_task_sets_under_the_harness(tmp_path: Path) -> None:
    """With gate.eval_dataset and a guard, the composite's weights step is judged on their
    prompts with the harness's system text, as the weights will serve: both models, both sets
    (tiny model, one token per answer)."""
    from reef.flows.weights import evaluate
    from reef.models import resolve_model
    from reef.recipe import Trained, WeightsRecipe
    from reef.records import Release, utcnow
    from reef.settings import load_settings

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"messages": [{"role": "user", "content": "Capital of Peru?"}]}))
    scorer = f"{__name__}:seen"
    guard = {"name": "g", "dataset": str(tasks), "scorer": scorer}
    gate = {"eval_dataset": str(tasks), "scorer": scorer, "max_tokens": 1, "guards": [guard]}
    settings = load_settings(None, gate=gate)
    model = resolve_model("tiny", tmp_path / "models")
    head = Release("rel_0", "s", 0, None, "base", utcnow())
    sft = load_recipe("sft")
    assert isinstance(sft, WeightsRecipe)
    harness = Harness({"AGENTS.md": "Answer with the city only.\n"})

    def prompts(under: Harness | None) -> list[list[dict[str, Any]]]:
        SEEN.clear()
        evaluate.fn(sft, settings, model, head, None, Trained("checkpoint", model), [], under)
        return list(SEEN)

    got = prompts(harness)
    assert len(got) == 4  # the task set and the guard, for the head and the candidate
    assert all(p == harness.inject([{"role": "user", "content": "Capital of Peru?"}]) for p in got)
    assert prompts(None) == [[{"role": "user", "content": "Capital of Peru?"}]] * 4


def _decision(status: str, reason: str) -> Decision:
    return Decision(status=status, policy="improve", test="bootstrap", reason=reason, n=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("harness", "weights", "status", "released"),
    [
        ("accepted", "accepted", "accepted", ["harness", "weights"]),
        ("accepted", "rejected", "accepted", ["harness"]),
        ("rejected", "pending", "pending", ["weights"]),
        ("rejected", "rejected", "rejected", []),
        ("nothing_to_train", "accepted", "accepted", ["weights"]),
    ],
)
def test_the_candidates_verdict_combines_the_steps(
    harness: str, weights: str, status: str, released: list[str]
) -> None:
    done = Steps(("harness", "weights"))
    done.outcomes["harness"] = Outcome(harness, "harness reason")
    done.outcomes["weights"] = Outcome(weights, "weights reason")
    got = combined(done, _decision("accepted", "primary"))
    assert got.status == status and done.passed == released
    assert got.reason == f"harness {harness}: harness reason; weights {weights}: weights reason"
    assert done.tags()["composite.parts"] == (",".join(released) or "none")
    assert done.summary()["released"] == released


def test_a_pending_candidate_that_brings_a_harness_waits_for_a_promote() -> None:
    """A composite candidate whose weights carry a new harness is released as a harness is:
    never on a tag or a resume, only by an admin's promote through Reef."""
    from reef.flows.release import brings_harness
    from reef.records import Candidate, utcnow

    def candidate(operation: str, metadata: dict[str, Any]) -> Candidate:
        now = utcnow()
        return Candidate(
            id="rel_1", scenario="s", parent_id="rel_0", kind="adapter", created_at=now,
            status="pending", uri=None, content_hash=None, recipe="composite", dataset_id=None,
            metrics={}, gate={}, model_uri=None, updated_at=now, operation=operation,
            metadata=metadata,
        )  # fmt: skip

    assert brings_harness(candidate("harness", {}))
    assert brings_harness(candidate("training", {"harness": {"key": "harness/s/x"}}))
    assert not brings_harness(candidate("training", {"composite": {}}))


def test_the_release_page_reads_each_part() -> None:
    assert parts({}) == ()
    meta = {
        "composite": {
            "order": ["weights", "harness"],
            "released": ["harness"],
            "steps": {
                "harness": {"status": "accepted", "reason": "ok"},
                "weights": {"status": "rejected", "reason": "no gain (n=3)"},
            },
        }
    }
    got = parts(meta)
    assert [(p.name, p.status, p.released) for p in got] == [
        ("weights", "rejected", False),
        ("harness", "accepted", True),
    ]
    assert got[0].reason == "no gain (n=3)"
