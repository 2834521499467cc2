"""What a scenario that trained leaves outside the database (artifact-store files, a local
cache, MLflow's registered model, runs and logged models), made by Reef's own code, and how
to see what MLflow still holds: for the deletion tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reef import registry
from reef.artifacts import ArtifactStore
from reef.records import new_id
from reef.settings import Settings

# The artifact-store prefixes that hold one scenario's files (`<prefix>/<scenario>/`): the
# dataset snapshots, release files, harness trees, harness evaluation caches, the rows
# retention archived, demo figures (reef.figures) and discovery archives (demo.discover).
PREFIXES = ("datasets", "releases", "harness", "harness-eval", "archive", "figures", "discover")


def footprint(settings: Settings, artifacts: ArtifactStore, scenario: str) -> None:
    """What a scenario that trained leaves outside the database: a file under every artifact
    prefix, a local cached copy, a registered model version (Reef's own registration: a run and
    a logged model with artifacts) and a run with an artifact of its own."""
    from mlflow import MlflowClient

    for prefix in PREFIXES:
        artifacts.put_bytes(f"{prefix}/{scenario}/x/file.bin", b"payload")
        cached = settings.server.state_dir / "cache" / prefix / scenario / "x"
        cached.mkdir(parents=True, exist_ok=True)
        (cached / "file.bin").write_bytes(b"payload")
    registry.register_base(
        settings.tracking_uri,
        scenario,
        new_id("rel"),
        "tiny",
        artifact_location=settings.mlflow_artifact_location,
    )
    client = MlflowClient(settings.tracking_uri)
    exp = client.get_experiment_by_name(f"reef/{scenario}")
    run = client.create_run(exp.experiment_id, run_name="evolve-sft")
    client.log_param(run.info.run_id, "recipe", "sft")
    client.log_text(run.info.run_id, "hello", "notes/hello.txt")
    client.set_terminated(run.info.run_id)


def mlflow_state(settings: Settings, scenario: str) -> dict[str, Any]:
    """What MLflow holds for `scenario`: versions, runs (any lifecycle), artifact files."""
    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    client = MlflowClient(settings.tracking_uri)
    versions = client.search_model_versions(f"name='reef-{scenario}'")
    exp = client.get_experiment_by_name(f"reef/{scenario}")
    runs = client.search_runs([exp.experiment_id], run_view_type=ViewType.ALL) if exp else []
    files = [
        p
        for r in runs
        for p in Path(r.info.artifact_uri.removeprefix("file://")).rglob("*")
        if p.is_file()
    ]
    return {
        "versions": len(versions),
        "experiment": exp is not None,
        "runs": len(runs),
        "files": files,
    }
