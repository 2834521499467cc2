"""Registering releases as model versions: a candidate's files, or the base release, logged as a
pyfunc model and registered under ``reef-<scenario>``.

MLflow numbers versions itself (retrying on a clash), and registering a release id that already
has a version returns that version (a retried publish).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reef.provenance import Provenance
from reef.registry.clients import (
    ensure_experiment,
    ensure_registered_model,
    mlflow_client,
    s3_endpoint,
)
from reef.registry.names import (
    CANDIDATE,
    CANDIDATE_KINDS,
    CONTENT_HASH,
    DATA_DIR,
    DATASET_ID,
    DEFAULT_MAX_NEW_TOKENS,
    GATE,
    KIND,
    METRIC_PREFIX,
    PARENT_ID,
    RECIPE,
    RELEASE_FILE,
    RELEASE_FORMAT,
    RELEASE_ID,
    RELEASED,
    STATUS,
    model_name,
)
from reef.registry.pyfunc import LOADER_MODULE, mlflow_pyfunc
from reef.registry.versions import get_tags, version_for_release

log = logging.getLogger(__name__)

# Packages whose versions a loaded model needs; pinning them explicitly skips MLflow's
# requirement inference (which loads the model in a subprocess: seconds per registration).
_REQUIREMENTS = ("mlflow", "torch", "transformers", "peft", "safetensors", "tokenizers")


def _requirements() -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in _REQUIREMENTS:
        try:
            out.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            out.append(name)
    return out


def _signature() -> Any:
    from mlflow.models import ModelSignature
    from mlflow.types import DataType, ParamSchema, ParamSpec

    # Inputs stay unconstrained (a list of prompts passes through to `predict` as it is); the
    # params schema is what lets MLflow hand `max_new_tokens` on to the model.
    return ModelSignature(
        params=ParamSchema(
            [
                ParamSpec("max_new_tokens", DataType.long, DEFAULT_MAX_NEW_TOKENS),
            ]
        )
    )


def _base_model_ref(base_model: str | Path | None) -> str | None:
    """A model directory as an absolute path; a spec ("tiny", "smollm2") as it is."""
    if base_model is None:
        return None
    path = Path(base_model).expanduser()
    return str(path.resolve()) if path.is_dir() else str(base_model)


def _stage(path: Path | None, meta: Mapping[str, Any], into: Path) -> Path:
    """The release's files plus reef_release.json in a fresh directory `into`. Files are
    hard-linked where possible (one real copy is made later, into the MLflow model)."""
    into.mkdir()
    if path is not None:
        for src in sorted(path.rglob("*")):
            rel = src.relative_to(path)
            if rel.as_posix() == RELEASE_FILE:
                continue  # ours replaces it (and must not write through a hard link)
            dst = into / rel
            if src.is_dir():
                dst.mkdir(exist_ok=True)
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)
    (into / RELEASE_FILE).write_text(json.dumps(dict(meta), indent=2, sort_keys=True) + "\n")
    return into


def _description(meta: Mapping[str, Any], metrics: Mapping[str, float]) -> str:
    lines = [
        f"Reef {meta['kind']} release `{meta['release_id']}` of scenario `{meta['scenario']}`"
        + (f", parent `{meta['parent_id']}`" if meta.get("parent_id") else ""),
    ]
    for key in ("recipe", "dataset_id", "gate", "content_hash"):
        if meta.get(key):
            lines.append(f"- {key}: `{meta[key]}`")
    if metrics:
        lines.append("- metrics: `" + json.dumps(dict(metrics), sort_keys=True) + "`")
    return "\n".join(lines)


def _register(
    tracking_uri: str,
    scenario: str,
    meta: dict[str, Any],
    path: Path | None,
    tags: dict[str, str],
    metrics: Mapping[str, float],
    *,
    run_id: str | None,
    experiment: str | None,
    artifact_location: str | None,
    registry_uri: str | None,
    s3_endpoint_url: str | None,
) -> str:
    """Log `path` (+ reef_release.json) as a pyfunc LoggedModel, register it as a new version
    of ``reef-<scenario>``. Uses the client API throughout (no fluent, process-global state), so
    threads with different tracking URIs do not interfere."""
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus

    name = model_name(scenario)
    release_id = meta["release_id"]
    client = mlflow_client(tracking_uri, registry_uri)

    own_run = run_id is None
    if run_id is None:
        experiment_id = ensure_experiment(
            tracking_uri, experiment or f"reef/{scenario}", artifact_location
        )
        run_id = client.create_run(
            experiment_id,
            run_name=f"register-{release_id}",
            tags={"reef.scenario": scenario, RELEASE_ID: release_id},
        ).info.run_id
    else:
        experiment_id = client.get_run(run_id).info.experiment_id

    logged = None
    try:
        logged = client.create_logged_model(
            experiment_id,
            name=release_id,
            source_run_id=run_id,
            tags=tags,
            params={k: str(v) for k, v in meta.items() if v is not None},
            model_type=meta["kind"],
        )
        _log_files(client, logged, run_id, path, meta, s3_endpoint_url)
        client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
        client.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step=0)])
        _log_metrics(client, run_id, logged.model_id, metrics)
        version = _new_version(client, name, logged, run_id, tags, _description(meta, metrics))
    except BaseException:
        if logged is not None:
            _quietly(client.finalize_logged_model, logged.model_id, LoggedModelStatus.FAILED)
        if own_run:
            _quietly(client.set_terminated, run_id, "FAILED")
        raise
    if own_run:
        client.set_terminated(run_id, "FINISHED")
    uri = f"models:/{name}/{version}"
    log.info("registered %s release %s as %s", meta["kind"], release_id, uri)
    return uri


def _log_files(
    client: Any,
    logged: Any,
    run_id: str,
    path: Path | None,
    meta: dict[str, Any],
    s3_endpoint_url: str | None,
) -> None:
    """The release's files (staged with reef_release.json) saved as a pyfunc model and
    uploaded as the LoggedModel's artifacts."""
    from mlflow.models import Model

    with tempfile.TemporaryDirectory(prefix="reef-register-") as tmp:
        staged = _stage(path, meta, Path(tmp) / DATA_DIR)
        local = Path(tmp) / "model"
        mlflow_pyfunc().save_model(
            path=str(local),
            loader_module=LOADER_MODULE,
            data_path=str(staged),
            mlflow_model=Model(
                artifact_path=logged.artifact_location,
                model_uuid=logged.model_id,
                run_id=run_id,
                model_id=logged.model_id,
                metadata={"reef": meta},
            ),
            signature=_signature(),
            # an example (without one MLflow warns); saving it runs nothing
            input_example=(["Hello!"], {"max_new_tokens": 8}),
            pip_requirements=_requirements(),
        )
        with s3_endpoint(s3_endpoint_url):
            client.log_model_artifacts(logged.model_id, str(local))


def _log_metrics(client: Any, run_id: str, model_id: str, metrics: Mapping[str, float]) -> None:
    """The candidate's metrics on the run, linked to its LoggedModel (nothing when none)."""
    from mlflow.entities import Metric
    from mlflow.utils.time import get_current_time_millis

    if not metrics:
        return
    now = get_current_time_millis()
    client.log_batch(
        run_id,
        metrics=[Metric(k, float(v), now, 0, model_id=model_id) for k, v in metrics.items()],
    )


def _new_version(
    client: Any, name: str, logged: Any, run_id: str, tags: dict[str, str], description: str
) -> str:
    """A new version of the registered model `name` (created on first use) for the
    LoggedModel, which is tagged with it in turn; the version number."""
    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

    ensure_registered_model(client, name)
    # Source is the artifact location, not "models:/<model_id>": MLflow's SQL registry
    # resolves the latter through a client on the process-global tracking URI.
    version = client.create_model_version(
        name,
        source=logged.artifact_location,
        run_id=run_id,
        tags=tags,
        description=description,
        model_id=logged.model_id,
    )
    client.set_logged_model_tags(
        logged.model_id,
        {MLFLOW_MODEL_VERSIONS: json.dumps([{"name": name, "version": version.version}])},
    )
    return str(version.version)


def _quietly(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except Exception as e:  # cleanup after a failure must not hide the failure
        log.warning("MLflow cleanup %s%s failed: %s", fn.__name__, args, e)


def _existing(
    tracking_uri: str,
    scenario: str,
    release_id: str,
    content_hash: str | None,
    registry_uri: str | None,
) -> str | None:
    """The version already registered for `release_id` (a retried publish), checked to hold the
    same content."""
    from reef.errors import Conflict

    uri = version_for_release(tracking_uri, scenario, release_id, registry_uri=registry_uri)
    if uri is None:
        return None
    have = get_tags(tracking_uri, uri, registry_uri=registry_uri).get(CONTENT_HASH)
    if (have or None) != (content_hash or None):
        raise Conflict(
            f"release {release_id} is already registered as {uri} with content hash {have}, "
            f"not {content_hash}"
        )
    return uri


def _candidate_files(path: str | Path, kind: str) -> Path:
    """The candidate's directory, checked to hold what its kind needs."""
    if kind not in CANDIDATE_KINDS:
        raise ValueError(f"kind must be one of {', '.join(CANDIDATE_KINDS)}, not '{kind}'")
    src = Path(path).expanduser()
    if not src.is_dir():
        raise ValueError(f"candidate path {src} is not a directory")
    if kind == "adapter" and not (src / "adapter_config.json").is_file():
        raise ValueError(f"adapter {src} has no adapter_config.json")
    if kind == "checkpoint" and not (src / "config.json").is_file():
        raise ValueError(f"checkpoint {src} has no config.json")
    return src


def _loaded_onto(src: Path, kind: str, base_model: str | Path | None) -> str | Path | None:
    """The model a candidate is loaded onto: `base_model` when given; for an adapter, else, the
    ``base_model_name_or_path`` of its adapter_config.json."""
    if base_model is None and kind == "adapter":
        config = json.loads((src / "adapter_config.json").read_text())
        return config.get("base_model_name_or_path")
    return base_model


def register_candidate(
    tracking_uri: str,
    scenario: str,
    release_id: str,
    path: str | Path,
    provenance: Provenance,
    *,
    kind: str,
    parent_id: str | None,
    content_hash: str,
    gate: str,
    experiment: str | None = None,
    artifact_location: str | None = None,
    registry_uri: str | None = None,
    s3_endpoint_url: str | None = None,
    extra: Mapping[str, str | None] | None = None,
) -> str:
    """Log the candidate at `path` (an adapter or full model directory, or a harness tree) as
    a pyfunc model and register it as a new version of ``reef-<scenario>``, tagged with the
    release's ids, gate decision, its provenance (recipe, dataset, metrics) and
    ``reef.status=candidate``.

    Logged under the run `provenance.run_id` when given; otherwise under a new run in
    `experiment` (default ``reef/<scenario>``), created at `artifact_location` if it does not
    exist yet. `provenance.base_model` (a model directory, or a spec such as "tiny") is what an
    adapter is loaded onto; for an adapter it defaults to the ``base_model_name_or_path`` in
    its adapter_config.json.
    Registering a release id again returns the existing version (same content hash) or raises
    Conflict. `extra` adds fields to reef_release.json and ``reef.<key>`` tags (a harness
    names the weights it is served with). Returns ``models:/reef-<scenario>/<version>``.
    """
    src = _candidate_files(path, kind)
    base_model = _loaded_onto(src, kind, provenance.base_model)
    name = model_name(scenario)  # validates before anything is written
    existing = _existing(tracking_uri, scenario, release_id, content_hash, registry_uri)
    if existing is not None:
        log.info("release %s is already registered as %s", release_id, existing)
        return existing
    meta = {
        "format": RELEASE_FORMAT,
        "scenario": scenario,
        "registered_model": name,
        "release_id": release_id,
        "parent_id": parent_id,
        "kind": kind,
        "base_model": _base_model_ref(base_model),
        "content_hash": content_hash,
        "recipe": provenance.recipe,
        "dataset_id": provenance.dataset_id,
        "gate": gate,
        **(extra or {}),
    }
    tags = {
        RELEASE_ID: release_id,
        PARENT_ID: parent_id or "",
        KIND: kind,
        CONTENT_HASH: content_hash,
        RECIPE: provenance.recipe,
        DATASET_ID: provenance.dataset_id or "",
        GATE: gate,
        STATUS: CANDIDATE,
        **{f"{METRIC_PREFIX}{k}": repr(float(v)) for k, v in provenance.metrics.items()},
        **{f"reef.{k}": str(v) for k, v in (extra or {}).items() if v},
    }
    return _register(
        tracking_uri,
        scenario,
        meta,
        src,
        tags,
        provenance.metrics,
        run_id=provenance.run_id,
        experiment=experiment,
        artifact_location=artifact_location,
        registry_uri=registry_uri,
        s3_endpoint_url=s3_endpoint_url,
    )


def register_base(
    tracking_uri: str,
    scenario: str,
    release_id: str,
    base_model: str | Path,
    *,
    experiment: str | None = None,
    artifact_location: str | None = None,
    registry_uri: str | None = None,
    s3_endpoint_url: str | None = None,
) -> str:
    """Mirror the chain's base release (seq 0, no files): a version whose artifact is only
    reef_release.json (kind "base", `base_model`), tagged ``reef.status=released``, so a
    rollback to the base has a model URI too. It does not move the champion alias. Idempotent
    per release id."""
    model_name(scenario)
    existing = _existing(tracking_uri, scenario, release_id, None, registry_uri)
    if existing is not None:
        return existing
    meta = {
        "format": RELEASE_FORMAT,
        "scenario": scenario,
        "registered_model": model_name(scenario),
        "release_id": release_id,
        "parent_id": None,
        "kind": "base",
        "base_model": _base_model_ref(base_model),
    }
    tags = {
        RELEASE_ID: release_id,
        PARENT_ID: "",
        KIND: "base",
        GATE: "base",
        STATUS: RELEASED,
    }
    return _register(
        tracking_uri,
        scenario,
        meta,
        None,
        tags,
        {},
        run_id=None,
        experiment=experiment,
        artifact_location=artifact_location,
        registry_uri=registry_uri,
        s3_endpoint_url=s3_endpoint_url,
    )
