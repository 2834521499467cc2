"""The MLflow registry mirror on real MLflow (SQLite tracking store, local and S3 artifacts):
candidates load back as pyfunc models that answer like plain transformers + PEFT, tags and
aliases mirror the chain, concurrent registrations all get their own version."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from reef import registry
from reef.errors import Conflict
from reef.provenance import Provenance
from reef.records import new_id
from tests.registry.conftest import MAX_NEW, PROMPTS


def register(
    tracking_uri: str, scenario: str, path: Path, base: Path, **overrides: Any
) -> tuple[str, str]:
    """Register a candidate with plausible metadata; returns (release id, model URI)."""
    release_id = overrides.pop("release_id", new_id("rel"))
    made = Provenance(
        recipe="sft",
        dataset_id="ds_1",
        metrics={"eval_mean": 0.75, "improvement": 0.25},
        run_id=overrides.pop("run_id", None),
        base_model=base,
    )
    fields: dict[str, Any] = {
        "kind": "adapter",
        "parent_id": "rel_base",
        "content_hash": f"sha256-{release_id}",
        "gate": "accepted",
    }
    fields.update(overrides)
    uri = registry.register_candidate(tracking_uri, scenario, release_id, path, made, **fields)
    return release_id, uri


def test_model_name_rule() -> None:
    assert registry.model_name("support-bot_v2.1") == "reef-support-bot_v2.1"
    for bad in ("", "a/b", "a:b", "a b"):
        with pytest.raises(ValueError):
            registry.model_name(bad)


# MLflow 3.17 warns about its own type hints while `mlflow.pyfunc` is first imported
@pytest.mark.filterwarnings("ignore:.*type hint is inferred as AnyType:UserWarning")
def test_adapter_candidate_loads_in_mlflow_and_answers_like_peft(
    global_tracking_uri: str,
    artifact_location: str,
    scenario: str,
    tiny_dir: Path,
    adapter_dir: Path,
    adapter_answers: list[str],
    base_answers: list[str],
) -> None:
    import mlflow.pyfunc
    from peft import PeftModel

    uri = global_tracking_uri
    _, model_uri = register(
        uri, scenario, adapter_dir, tiny_dir, artifact_location=artifact_location
    )
    assert model_uri == f"models:/reef-{scenario}/1"

    model = mlflow.pyfunc.load_model(model_uri)  # plain MLflow, through the global URI
    answers = model.predict(PROMPTS, params={"max_new_tokens": MAX_NEW})
    assert answers == adapter_answers
    assert adapter_answers != base_answers  # the adapter was applied
    # chat messages and {"messages": ...} are prompts too
    as_messages = [[{"role": "user", "content": p}] for p in PROMPTS]
    assert model.predict(as_messages, params={"max_new_tokens": MAX_NEW}) == adapter_answers
    assert model.predict({"messages": as_messages[0]}, params={"max_new_tokens": MAX_NEW}) == [
        adapter_answers[0]
    ]

    # registry.load resolves through the given URI, not the global one
    again = registry.load(uri, model_uri)
    assert again.predict(PROMPTS, params={"max_new_tokens": MAX_NEW}) == adapter_answers
    assert isinstance(again.get_raw_model(), PeftModel)


def test_candidate_tags_metadata_and_files(
    tracking_uri: str, artifact_location: str, scenario: str, tiny_dir: Path, adapter_dir: Path
) -> None:
    from mlflow import MlflowClient
    from mlflow.artifacts import download_artifacts

    release_id, model_uri = register(
        tracking_uri,
        scenario,
        adapter_dir,
        tiny_dir,
        artifact_location=artifact_location,
        gate="pending",
    )
    tags = registry.get_tags(tracking_uri, model_uri)
    assert {k: v for k, v in tags.items() if k.startswith("reef.")} == {
        "reef.release_id": release_id,
        "reef.parent_id": "rel_base",
        "reef.kind": "adapter",
        "reef.content_hash": f"sha256-{release_id}",
        "reef.recipe": "sft",
        "reef.dataset_id": "ds_1",
        "reef.gate": "pending",
        "reef.status": "candidate",
        "reef.metric.eval_mean": "0.75",
        "reef.metric.improvement": "0.25",
    }
    client = MlflowClient(tracking_uri)
    mv = client.get_model_version(f"reef-{scenario}", "1")
    assert release_id in mv.description and "eval_mean" in mv.description
    assert mv.run_id
    # the run that logged it is in the scenario's experiment, finished, with the metrics
    run = client.get_run(mv.run_id)
    assert client.get_experiment(run.info.experiment_id).name == f"reef/{scenario}"
    assert client.get_experiment(run.info.experiment_id).artifact_location == artifact_location
    assert run.info.status == "FINISHED"
    assert run.data.metrics == {"eval_mean": 0.75, "improvement": 0.25}
    # the LoggedModel behind it: ready, linked to the version, stored under the location
    (logged,) = client.search_logged_models([run.info.experiment_id])
    assert str(logged.status).endswith("READY")
    assert json.loads(logged.tags["mlflow.modelVersions"]) == [
        {"name": f"reef-{scenario}", "version": 1}
    ]
    assert logged.source_run_id == mv.run_id and logged.artifact_location == mv.source
    assert logged.artifact_location.startswith(artifact_location)

    # the artifact: the adapter's files plus reef_release.json, under the artifact location
    local = Path(download_artifacts(mv.source, dst_path=str(Path.cwd() / "dl")))
    release = local / "data" / "release"
    assert {p.name for p in adapter_dir.iterdir()} <= {p.name for p in release.iterdir()}
    meta = json.loads((release / "reef_release.json").read_text())
    assert meta["kind"] == "adapter" and meta["release_id"] == release_id
    assert meta["parent_id"] == "rel_base" and meta["base_model"] == str(tiny_dir.resolve())
    assert (local / "requirements.txt").read_text().count("==") >= 4  # pinned, not inferred
    assert not (adapter_dir / "reef_release.json").exists()  # the input is left alone


def test_champion_and_lookup_by_release(
    tracking_uri: str, scenario: str, tiny_dir: Path, adapter_dir: Path
) -> None:
    assert registry.champion(tracking_uri, scenario) is None  # no registered model yet
    first_id, first = register(tracking_uri, scenario, adapter_dir, tiny_dir)
    second_id, second = register(tracking_uri, scenario, adapter_dir, tiny_dir)
    assert registry.champion(tracking_uri, scenario) is None  # registered, no champion

    registry.set_champion(tracking_uri, scenario, first)
    assert registry.champion(tracking_uri, scenario) == (1, first_id)
    assert registry.get_tags(tracking_uri, first)["reef.status"] == "released"
    assert registry.get_tags(tracking_uri, second)["reef.status"] == "candidate"
    registry.set_champion(tracking_uri, scenario, 2)  # a bare version works too
    assert registry.champion(tracking_uri, scenario) == (2, second_id)
    assert (
        registry.get_tags(tracking_uri, f"models:/reef-{scenario}@champion")["reef.release_id"]
        == second_id
    )

    assert registry.version_for_release(tracking_uri, scenario, first_id) == first
    assert registry.version_for_release(tracking_uri, scenario, second_id) == second
    assert registry.version_for_release(tracking_uri, scenario, "rel_nope") is None
    assert registry.version_for_release(tracking_uri, "other", first_id) is None
    with pytest.raises(ValueError):
        registry.set_champion(tracking_uri, scenario, "models:/reef-other/1")


def test_approval_status_and_tags(
    tracking_uri: str, scenario: str, tiny_dir: Path, adapter_dir: Path
) -> None:
    _, uri = register(tracking_uri, scenario, adapter_dir, tiny_dir, gate="pending")
    assert registry.approval(tracking_uri, uri) is None
    registry.mark(tracking_uri, uri, "pending")
    assert registry.get_tags(tracking_uri, uri)["reef.status"] == "pending"

    # what a human does in the MLflow UI: set reef.approval on the version
    from mlflow import MlflowClient

    MlflowClient(tracking_uri).set_model_version_tag(
        f"reef-{scenario}", "1", "reef.approval", "Approved "
    )
    assert registry.approval(tracking_uri, uri) == "approved"
    registry.set_tag(tracking_uri, uri, "reef.approval", "rejected")
    assert registry.approval(tracking_uri, uri) == "rejected"
    registry.set_tag(tracking_uri, uri, "reef.approval", "maybe")
    assert registry.approval(tracking_uri, uri) is None

    registry.mark(tracking_uri, uri, "rejected")
    assert registry.get_tags(tracking_uri, uri)["reef.status"] == "rejected"
    with pytest.raises(ValueError):
        registry.mark(tracking_uri, uri, "Not A Status")


def test_base_release_has_a_model_uri_that_loads_the_base(
    tracking_uri: str, scenario: str, tiny_dir: Path, base_answers: list[str]
) -> None:
    uri = registry.register_base(tracking_uri, scenario, "rel_base", tiny_dir)
    assert uri == f"models:/reef-{scenario}/1"
    tags = registry.get_tags(tracking_uri, uri)
    assert tags["reef.kind"] == "base" and tags["reef.status"] == "released"
    assert registry.version_for_release(tracking_uri, scenario, "rel_base") == uri
    assert registry.register_base(tracking_uri, scenario, "rel_base", tiny_dir) == uri  # again
    registry.set_champion(tracking_uri, scenario, uri)  # rollback to the base
    assert registry.champion(tracking_uri, scenario) == (1, "rel_base")
    model = registry.load(tracking_uri, uri)
    assert model.predict(PROMPTS, params={"max_new_tokens": MAX_NEW}) == base_answers


# MLflow 3.17 warns about its own type hints while `mlflow.pyfunc` is first imported
@pytest.mark.filterwarnings("ignore:.*type hint is inferred as AnyType:UserWarning")
def test_the_loader_module_recorded_in_versions_keeps_loading(
    tracking_uri: str, scenario: str, tiny_dir: Path, base_answers: list[str]
) -> None:
    """A version's MLmodel names the module MLflow imports to load it, and versions registered
    before reef/registry.py became a package name ``reef.registry``: that path and its
    ``_load_pyfunc`` must keep resolving."""
    import importlib

    import mlflow.pyfunc
    from mlflow import MlflowClient
    from mlflow.artifacts import download_artifacts
    from mlflow.models import Model

    uri = registry.register_base(tracking_uri, scenario, "rel_base", tiny_dir)
    mv = MlflowClient(tracking_uri).get_model_version(f"reef-{scenario}", uri.rsplit("/", 1)[1])
    local = Path(download_artifacts(mv.source, dst_path=str(Path.cwd() / "dl")))
    flavor = Model.load(str(local)).flavors["python_function"]
    assert flavor["loader_module"] == "reef.registry"  # what the single-module registry wrote
    assert not flavor.get("code")  # no copy of Reef's code inside: the import path is all

    loader = importlib.import_module(flavor["loader_module"])._load_pyfunc
    direct = loader(str(local / flavor["data"]))
    assert isinstance(direct, registry.ReleaseModel)
    assert direct.predict(PROMPTS, params={"max_new_tokens": MAX_NEW}) == base_answers
    # as MLflow loads it: from the MLmodel file, through the recorded loader module
    model = mlflow.pyfunc.load_model(str(local))
    assert model.loader_module == "reef.registry"
    assert model.predict(PROMPTS, params={"max_new_tokens": MAX_NEW}) == base_answers


def test_checkpoint_candidate_loads_the_checkpoint(
    tracking_uri: str, scenario: str, tiny_dir: Path, tmp_path: Path, base_answers: list[str]
) -> None:
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(tiny_dir, checkpoint)  # a "trained" full model: here the base itself
    _, uri = register(tracking_uri, scenario, checkpoint, None, kind="checkpoint")
    assert registry.get_tags(tracking_uri, uri)["reef.kind"] == "checkpoint"
    model = registry.load(tracking_uri, uri)
    assert model.predict(PROMPTS, params={"max_new_tokens": MAX_NEW}) == base_answers


def test_registering_a_release_again_returns_its_version(
    tracking_uri: str, scenario: str, tiny_dir: Path, adapter_dir: Path
) -> None:
    release_id, uri = register(tracking_uri, scenario, adapter_dir, tiny_dir)
    same = register(tracking_uri, scenario, adapter_dir, tiny_dir, release_id=release_id)
    assert same == (release_id, uri)  # a retried publish does not add a version
    with pytest.raises(Conflict):
        register(
            tracking_uri,
            scenario,
            adapter_dir,
            tiny_dir,
            release_id=release_id,
            content_hash="sha256-other",
        )


def test_bad_candidates_are_refused(
    tracking_uri: str, scenario: str, tiny_dir: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"adapter_config\.json"):
        register(tracking_uri, scenario, empty, tiny_dir)
    with pytest.raises(ValueError, match=r"has no config\.json"):
        register(tracking_uri, scenario, empty, tiny_dir, kind="checkpoint")
    with pytest.raises(ValueError, match="kind"):
        register(tracking_uri, scenario, empty, tiny_dir, kind="base")
    with pytest.raises(ValueError, match="scenario"):
        register(tracking_uri, "no/slash", empty, tiny_dir, kind="harness")


def test_under_a_given_run(
    tracking_uri: str, artifact_location: str, scenario: str, tiny_dir: Path, adapter_dir: Path
) -> None:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    exp = registry.ensure_experiment(tracking_uri, "training", artifact_location)
    assert registry.ensure_experiment(tracking_uri, "training", artifact_location) == exp
    run = client.create_run(exp)
    _, uri = register(tracking_uri, scenario, adapter_dir, tiny_dir, run_id=run.info.run_id)
    mv = client.get_model_version(f"reef-{scenario}", uri.rsplit("/", 1)[1])
    assert mv.run_id == run.info.run_id
    assert client.get_run(run.info.run_id).info.status == "RUNNING"  # the caller's to end
    (logged,) = client.search_logged_models([exp])
    assert logged.source_run_id == run.info.run_id and logged.artifact_location == mv.source


def test_concurrent_registrations_get_distinct_versions(
    tracking_uri: str, artifact_location: str, scenario: str, tiny_dir: Path, adapter_dir: Path
) -> None:
    """Eight publishers at once on an empty store: the experiment, the registered model and the
    versions are all created under contention."""
    start = threading.Barrier(8)

    def one(k: int) -> tuple[str, str]:
        start.wait()
        return register(
            tracking_uri, scenario, adapter_dir, tiny_dir, artifact_location=artifact_location
        )

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    versions = sorted(int(uri.rsplit("/", 1)[1]) for _, uri in results)
    assert versions == list(range(1, 9))
    for release_id, uri in results:
        assert registry.version_for_release(tracking_uri, scenario, release_id) == uri


def test_s3_artifacts(
    tracking_uri: str,
    scenario: str,
    tiny_dir: Path,
    adapter_dir: Path,
    adapter_answers: list[str],
    s3_endpoint: str,
    s3_bucket: str,
) -> None:
    import boto3

    location = f"s3://{s3_bucket}/mlflow"
    before = os.environ.get("MLFLOW_S3_ENDPOINT_URL")
    _, uri = register(
        tracking_uri,
        scenario,
        adapter_dir,
        tiny_dir,
        artifact_location=location,
        s3_endpoint_url=s3_endpoint,
    )
    assert os.environ.get("MLFLOW_S3_ENDPOINT_URL") == before  # set only during the calls

    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=s3_bucket)["Contents"]]
    assert any(k.endswith("data/release/adapter_model.safetensors") for k in keys)
    assert any(k.endswith("data/release/reef_release.json") for k in keys)
    assert all(k.startswith("mlflow/") for k in keys)
    assert registry.get_tags(tracking_uri, uri)["reef.kind"] == "adapter"

    model = registry.load(tracking_uri, uri, s3_endpoint_url=s3_endpoint)
    assert model.predict(PROMPTS, params={"max_new_tokens": MAX_NEW}) == adapter_answers


def test_s3_endpoint_override_is_shared_and_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    name = "REEF_TEST_OVERRIDE"
    monkeypatch.setenv(name, "outer")
    override = registry.EnvOverride(name)
    with override("a"), override("a"):  # same value: shared
        assert os.environ[name] == "a"
    assert os.environ[name] == "outer"
    with override(None):  # None: untouched
        assert os.environ[name] == "outer"

    order: list[str] = []
    entered = threading.Event()

    def other() -> None:
        entered.wait()
        with override("b"):  # another value waits for "a" to be released
            order.append(f"b={os.environ[name]}")

    t = threading.Thread(target=other)
    with override("a"):
        t.start()
        entered.set()
        t.join(0.2)
        order.append(f"a={os.environ[name]}")
    t.join(5)
    assert order == ["a=a", "b=b"]
    assert os.environ[name] == "outer"


_PUBLISHER = """
import sys
from reef import registry
from reef.provenance import Provenance

uri, adapter, base, name, count = sys.argv[1:]
for k in range(int(count)):
    print(registry.register_candidate(
        uri, "multi", f"rel_{name}_{k}", adapter, Provenance(recipe="sft", base_model=base),
        kind="adapter", parent_id="rel_base", content_hash=f"h_{name}_{k}", gate="accepted",
    ))
"""


@pytest.mark.slow
def test_concurrent_registrations_from_processes(
    tmp_path: Path, tiny_dir: Path, adapter_dir: Path
) -> None:
    """Four publisher processes on a store that does not exist yet: MLflow's tables, the
    experiment, the registered model and the versions are all created under contention."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _PUBLISHER, uri, str(adapter_dir), str(tiny_dir), f"p{k}", "2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        for k in range(4)
    ]
    outputs = [p.communicate(timeout=240) for p in procs]
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err[-3000:]
    uris = [line for out, _ in outputs for line in out.split()]
    assert sorted(int(u.rsplit("/", 1)[1]) for u in uris) == list(range(1, 9))
    for k in range(4):
        for j in range(2):
            assert registry.version_for_release(uri, "multi", f"rel_p{k}_{j}") in uris
