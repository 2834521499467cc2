"""The composite recipe through the evolve flow, in-process against a served Reef app (tiny
model): a harness step and a weights step on one batch, each judged by its own gate (a step's
`gate` keys make its verdict certain here: `always` passes, an unreachable `margin` rejects).
Both passing is one release carrying the new harness and the new weights, named so in its
metadata and on its MLflow model version; one failing publishes the other alone and the run
says which failed and why, in both orders."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from reef.cli.testing import InProcessReef
from reef.harness import Harness
from reef.testing.traffic import traffic

# Three whole evolve runs (Prefect, MLflow, training, deploy) on the tiny model: the loop stage
# (make test-loop), which keeps make test within its time.
pytestmark = pytest.mark.loop

WANTED = "Paris is the capital of France."
PASS = {"policy": "always"}
FAIL = {"policy": "improve", "margin": 1000.0}  # no mean improvement reaches it


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    with InProcessReef(tmp_path_factory.mktemp("composite")) as srv:
        yield srv


def _overrides(
    srv: InProcessReef, order: list[str], harness_gate: dict, weights_gate: dict
) -> dict[str, Any]:
    return {
        "server": {"state_dir": str(srv.state_dir), "port": srv.port},
        "engine": {"model": "tiny"},
        "reef": {
            "recipe": "composite",
            "batch_size": 6,
            "params": {
                "order": order,
                "harness": {
                    "recipe": "harness",
                    "params": {
                        "max_tokens": 8,
                        "proposer_max_tokens": 48,
                        "max_examples": 3,
                        "max_metric_calls": 7,
                        "repeats": 1,
                    },
                    "gate": harness_gate,
                },
                "weights": {
                    "recipe": "sft",
                    "params": {"epochs": 1, "max_steps": 2},
                    "gate": weights_gate,
                },
            },
        },
    }


def _failing_traffic(srv: InProcessReef, scenario: str, n: int = 12) -> None:
    """`n` questions answered wrongly, each reported with score 0 and a correction (what the
    harness search reflects on and what sft trains on)."""
    feedback = {"text": "Wrong: name the city.", "correction": WANTED}
    traffic(
        srv,
        scenario,
        n,
        prompt="Question {i}: what is the capital of France?",
        report=lambda i, rid: {"score": 0.0, "feedback": feedback},
        max_tokens=6,
        temperature=0,
    )


def _chain(srv: InProcessReef, scenario: str) -> list[dict]:
    return list(httpx.get(f"{srv.url}/reef/scenarios/{scenario}/releases").json()["data"])


def _tags(srv: InProcessReef, model_uri: str) -> dict[str, str]:
    from reef import registry

    return registry.get_tags(f"sqlite:///{(srv.state_dir / 'mlflow.db').resolve()}", model_uri)


def _run(srv: InProcessReef, run_id: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{(srv.state_dir / 'mlflow.db').resolve()}").get_run(run_id)


def _evolve(srv: InProcessReef, scenario: str, *gates: Any) -> tuple[dict, dict[str, Any]]:
    """The scenario's base release, and the result of evolving it on failing traffic."""
    from reef.flows.evolve import evolve

    _failing_traffic(srv, scenario)
    base = _chain(srv, scenario)[0]
    return base, evolve(scenario, overrides=_overrides(srv, *gates), force=True)


def test_both_steps_pass_one_release_carries_both(
    server: InProcessReef, prefect_server: None
) -> None:
    base, result = _evolve(server, "both", ["harness", "weights"], PASS, PASS)
    assert result["status"] == "published", result
    steps = result["steps"]
    assert steps["order"] == ["harness", "weights"] and steps["released"] == ["harness", "weights"]
    assert {s["status"] for s in steps["steps"].values()} == {"accepted"}
    chain = _chain(server, "both")
    assert len(chain) == 2  # one release for both parts
    head = chain[0]
    assert (
        head["release_id"] == result["release_id"]
        and head["parent_release_id"] == base["release_id"]
    )
    assert head["kind"] == "adapter"  # new weights...
    harness = head["metadata"]["harness"]  # ...serving the new harness
    assert "weights_release_id" not in head["metadata"]  # its own weights, not the parent's
    assert head["metadata"]["composite"]["released"] == ["harness", "weights"]
    assert head["recipe"] == "composite"

    got = httpx.get(f"{server.url}/reef/harness", params={"scenario": "both"}).json()
    assert got["release_id"] == head["release_id"]
    assert got["content_hash"] == harness["content_hash"]
    # the weights were trained and judged under the harness they serve with: its system text
    # (the searched rules) in every prompt
    assert Harness({f["path"]: f["content"] for f in got["files"]}).system_text()
    assert steps["weights_trained_under"] == harness["content_hash"]
    client = openai.OpenAI(
        base_url=server.base_url, api_key="none", default_headers={"x-reef-scenario": "both"}
    )
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=2
    )
    assert raw.headers["x-reef-release-id"] == head["release_id"]

    tags = _tags(server, head["model_uri"])
    assert tags["reef.composite.parts"] == "harness,weights"
    assert tags["reef.composite.harness.gate"] == tags["reef.composite.weights.gate"] == "accepted"
    assert tags["reef.composite.harness.content_hash"] == harness["content_hash"]

    run = _run(server, result["run_id"])  # the MLflow run names each part and its gate
    assert run.data.params["params.order"] == "harness,weights"
    assert run.data.params["params.weights.recipe"] == "sft"
    assert run.data.params["params.harness.recipe"] == "harness"
    assert run.data.tags["reef.harness.gate"] == run.data.tags["reef.weights.gate"] == "accepted"
    assert run.data.tags["reef.gate"] == "accepted"
    assert "harness.gate_n" in run.data.metrics and "weights.gate_n" in run.data.metrics
    # where the round's time went (flows.stages): each stage's seconds, within the run's
    times = {k: v for k, v in run.data.metrics.items() if k.startswith("time.")}
    for stage in ("prepare", "validate", "search", "train", "evaluate", "register", "deploy"):
        assert times[f"time.{stage}_s"] > 0, (stage, times)
    for stage in ("materialize", "pool", "gate"):  # a query, a paired test: may round to 0 ms
        assert times[f"time.{stage}_s"] >= 0, (stage, times)
    assert sum(v for k, v in times.items() if k != "time.total_s") <= times["time.total_s"]

    page = httpx.get(f"{server.url}/ui/s/both/releases").text
    assert "harness: accepted" in page and "weights: accepted" in page


@pytest.mark.parametrize(
    ("scenario", "order", "harness_gate", "weights_gate", "published", "failed"),
    [
        ("weights-fail", ["weights", "harness"], PASS, FAIL, "harness", "weights"),
        ("harness-fail", ["harness", "weights"], FAIL, PASS, "weights", "harness"),
    ],
)
def test_a_step_that_fails_its_gate_leaves_the_other_alone(
    server: InProcessReef,
    prefect_server: None,
    scenario: str,
    order: list[str],
    harness_gate: dict,
    weights_gate: dict,
    published: str,
    failed: str,
) -> None:
    base, result = _evolve(server, scenario, order, harness_gate, weights_gate)
    assert result["status"] == "published", result
    steps = result["steps"]
    assert steps["order"] == order and steps["released"] == [published]
    why = steps["steps"][failed]
    assert why["status"] == "rejected" and why["gate"]["margin"] == 1000.0 and why["reason"]
    assert f"{failed} rejected: " in result["gate"]["reason"]  # the run says which and why
    head = _chain(server, scenario)[0]
    assert head["release_id"] == result["release_id"]
    assert head["metadata"]["composite"]["steps"][failed]["status"] == "rejected"
    if published == "harness":  # the head's weights, the new harness
        assert head["operation"] == "harness" and head["kind"] == base["kind"] == "base"
        assert head["metadata"]["weights_release_id"] == base["release_id"]
    else:  # new weights; the head had no harness to keep
        assert head["operation"] == "training" and head["kind"] == "adapter"
        assert "harness" not in head["metadata"]
        assert steps["weights_trained_under"] is None  # the rejected harness was not used
    assert _run(server, result["run_id"]).data.tags[f"reef.{failed}.gate"] == "rejected"
    tags = _tags(server, head["model_uri"])
    assert tags["reef.composite.parts"] == published
    assert tags[f"reef.composite.{failed}.gate"] == "rejected"
    assert tags[f"reef.composite.{published}.gate"] == "accepted"
