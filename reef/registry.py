"""The MLflow model registry as a mirror of each scenario's release chain.

Names and tags (what a human sees in the MLflow UI):

- one registered model per scenario, named ``reef-<scenario>`` (`model_name`); scenario names
  are ``[A-Za-z0-9._-]+``, which MLflow accepts in a model name as they are;
- one model version per candidate (and optionally one for the base release, seq 0), tagged
  ``reef.release_id``, ``reef.parent_id``, ``reef.kind``, ``reef.content_hash``, ``reef.recipe``,
  ``reef.dataset_id``, ``reef.gate`` (the gate's decision), ``reef.status`` (candidate →
  released / rejected ...) and ``reef.metric.<name>`` per evaluation metric;
- the alias ``champion`` on the version of the chain's head (`set_champion`);
- ``reef.approval`` ("approved" / "rejected") is the tag a human sets in the UI on a pending
  candidate's version; `approval` reads it.

MLflow has no compare-and-swap, so the chain itself lives in Reef's database; this module only
mirrors it. Every function takes the tracking URI (and optionally a registry URI, by default the
same) explicitly and uses its own `MlflowClient`, never MLflow's process-global tracking URI or
active run. MLflow is imported inside the functions: it takes seconds to import, and reef/ is also
imported by the API process.

A version's artifact is an MLflow pyfunc model whose loader module is this module: its data
directory holds the release's files (a PEFT adapter, a full checkpoint or a harness tree) and
``reef_release.json`` (kind, base model, release ids), and ``mlflow.pyfunc.load_model(uri)``
returns a model whose ``predict`` answers a list of chat prompts with transformers (+ PEFT).
Loading needs ``reef`` importable (it is the loader module) and, for adapters, the base model
directory recorded at registration (or another one passed as ``model_config={"base_model": ...}``).

Concurrency: MLflow numbers versions itself (retrying on a clash), registering a model that
another process just registered is not an error here, and the first opening of a new SQLite
store is serialised across processes with a lock file next to it (``<db>.reef-lock``), since
MLflow's own table creation breaks when two processes do it at once (see `_set_up_stores`).
Registering a release id that already has a version returns that version (a retried publish).

S3: MLflow's S3 artifact repository takes its endpoint only from the environment variable
``MLFLOW_S3_ENDPOINT_URL`` (there is no per-call or per-client parameter in MLflow 3.17). Functions
that move artifacts take ``s3_endpoint_url`` and set that variable only for the duration of the
MLflow calls that upload or download (`_s3_endpoint`); concurrent callers with the same endpoint
share the setting, a caller with another endpoint waits until they are done, and the previous value
is restored afterwards. With ``s3_endpoint_url=None`` nothing is touched (AWS, or whatever the
process environment says). Credentials come from boto3's usual chain.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MODEL_PREFIX = "reef-"
CHAMPION = "champion"
RELEASE_FILE = "reef_release.json"
RELEASE_FORMAT = 1
DATA_DIR = "release"  # the pyfunc data directory inside the model: the release's files

# tag keys on a model version
RELEASE_ID = "reef.release_id"
PARENT_ID = "reef.parent_id"
KIND = "reef.kind"
CONTENT_HASH = "reef.content_hash"
RECIPE = "reef.recipe"
DATASET_ID = "reef.dataset_id"
GATE = "reef.gate"
STATUS = "reef.status"
APPROVAL = "reef.approval"
METRIC_PREFIX = "reef.metric."

# reef.status values written here; `mark` accepts others of the same shape (e.g. "pending")
CANDIDATE, RELEASED, REJECTED = "candidate", "released", "rejected"
APPROVED = "approved"
APPROVALS = (APPROVED, REJECTED)

CANDIDATE_KINDS = ("adapter", "checkpoint", "harness")
DEFAULT_MAX_NEW_TOKENS = 32

_SCENARIO = re.compile(r"^[A-Za-z0-9._-]+$")
_STATUS = re.compile(r"^[a-z][a-z0-9_]*$")
_MODEL_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:/(?P<version>\d+)|@(?P<alias>[\w-]+))$")
# Packages whose versions a loaded model needs; pinning them explicitly skips MLflow's
# requirement inference (which loads the model in a subprocess: seconds per registration).
_REQUIREMENTS = ("mlflow", "torch", "transformers", "peft", "safetensors", "tokenizers")


def model_name(scenario: str) -> str:
    """The registered model mirroring `scenario`'s chain: ``reef-<scenario>``."""
    if not _SCENARIO.match(scenario):
        raise ValueError(f"invalid scenario name '{scenario}' (letters, digits, '.', '_', '-')")
    return MODEL_PREFIX + scenario


def model_uri(scenario: str, version: int | str) -> str:
    return f"models:/{model_name(scenario)}/{version}"


# --- clients, experiments, the S3 endpoint ------------------------------------------------------


def _client(tracking_uri: str, registry_uri: str | None = None) -> Any:
    from mlflow import MlflowClient

    registry_uri = registry_uri or tracking_uri
    if (tracking_uri, registry_uri) not in _ready_stores:
        _set_up_stores(tracking_uri, registry_uri)
    return MlflowClient(tracking_uri=tracking_uri, registry_uri=registry_uri)


# Stores this process has opened once (their tables exist): a memo, so the set-up below runs
# once per store and process.
_ready_stores: set[tuple[str, str]] = set()
_ready_lock = threading.Lock()
_DB_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
STORE_SETUP_TIMEOUT_S = 120.0


def _set_up_stores(tracking_uri: str, registry_uri: str) -> None:
    """Open the stores once, serialised against other processes opening the same new database.

    MLflow creates and migrates its tables when a process first opens a database store. Two
    processes doing that at once on a new database make one of them fail ("table ... already
    exists") and can leave the schema half-migrated for good. For SQLite an exclusive lock on a
    file next to the database serialises the first opening across processes; for a database
    server (where Reef cannot take that lock) a failed opening is retried until the other process
    is done (creating the database once up front, e.g. `mlflow db upgrade`, avoids the race).
    """
    from contextlib import ExitStack

    from mlflow import MlflowClient

    with _ready_lock, ExitStack() as stack:
        if (tracking_uri, registry_uri) in _ready_stores:
            return
        for uri in dict.fromkeys((tracking_uri, registry_uri)):
            stack.enter_context(_sqlite_setup_lock(uri))
        deadline = time.monotonic() + STORE_SETUP_TIMEOUT_S
        delay = 0.2
        while True:
            try:
                client = MlflowClient(tracking_uri=tracking_uri, registry_uri=registry_uri)
                client.search_registered_models(max_results=1)  # the registry store opens lazily
                break
            except Exception as e:
                if not tracking_uri.startswith(_DB_SCHEMES) or time.monotonic() > deadline:
                    raise
                log.info(
                    "MLflow store %s is being set up elsewhere (%s); retrying", tracking_uri, e
                )
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
        _ready_stores.add((tracking_uri, registry_uri))


@contextmanager
def _sqlite_setup_lock(uri: str) -> Iterator[None]:
    """An exclusive lock on ``<database>.reef-lock`` for a sqlite:/// URI; nothing otherwise."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    import fcntl

    db = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{db}.reef-lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _error_code(e: Exception) -> str | None:
    return getattr(e, "error_code", None)


def _already_exists(e: Exception) -> bool:
    return _error_code(e) in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS")


def _does_not_exist(e: Exception) -> bool:
    return _error_code(e) in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND")


def ensure_experiment(tracking_uri: str, name: str, artifact_location: str | None = None) -> str:
    """The id of experiment `name`, created with `artifact_location` (settings'
    `mlflow_artifact_location`) when missing. An existing experiment keeps its location: MLflow
    cannot move one. Safe against another process creating it at the same time."""
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    found = client.get_experiment_by_name(name)
    if found is not None:
        if artifact_location and found.artifact_location.rstrip("/") != artifact_location.rstrip(
            "/"
        ):
            log.info(
                "experiment %s keeps its artifact location %s (asked for %s)",
                name,
                found.artifact_location,
                artifact_location,
            )
        return str(found.experiment_id)
    try:  # (creating an experiment writes no artifact, on S3 or elsewhere)
        return str(client.create_experiment(name, artifact_location=artifact_location))
    except MlflowException as e:
        if not _already_exists(e):
            raise
    found = client.get_experiment_by_name(name)
    if found is None:  # created and deleted in between: nothing sensible to do but fail
        raise RuntimeError(f"experiment '{name}' vanished while being created")
    return str(found.experiment_id)


def _ensure_registered_model(client: Any, name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(
            name, description="Reef release chain (mirror; the chain's CAS is Reef's database)"
        )
    except MlflowException as e:
        if not _already_exists(e):  # another process registered it first: fine
            raise


class _EnvOverride:
    """One environment variable set while any user holds it, shared by users that want the same
    value; a user wanting another value waits. The previous value comes back at the end."""

    def __init__(self, name: str):
        self.name = name
        self._cond = threading.Condition()
        self._users = 0
        self._saved: str | None = None

    @contextmanager
    def __call__(self, value: str | None) -> Iterator[None]:
        if value is None:
            yield
            return
        with self._cond:
            while self._users and os.environ.get(self.name) != value:
                self._cond.wait()
            if self._users == 0:
                self._saved = os.environ.get(self.name)
                os.environ[self.name] = value
            self._users += 1
        try:
            yield
        finally:
            with self._cond:
                self._users -= 1
                if self._users == 0:
                    if self._saved is None:
                        os.environ.pop(self.name, None)
                    else:
                        os.environ[self.name] = self._saved
                    self._cond.notify_all()


# MLflow reads the S3 endpoint from this variable whenever it makes an S3 client (see the module
# docstring); the only place Reef writes the environment.
_s3_endpoint = _EnvOverride("MLFLOW_S3_ENDPOINT_URL")


def s3_endpoint(endpoint_url: str | None) -> Any:
    """A context in which MLflow's own S3 calls (run artifacts, dataset inputs) go to
    `endpoint_url` (None: MLflow's default, AWS); for code that logs to MLflow directly."""
    return _s3_endpoint(endpoint_url)


def _pyfunc() -> Any:
    """`mlflow.pyfunc`, imported without the UserWarning MLflow 3.17 emits about its own type
    hints while importing it (an error where warnings are errors, as in Reef's tests)."""
    if "mlflow.pyfunc" not in sys.modules:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message=".*type hint is inferred as AnyType", category=UserWarning
            )
            import mlflow.pyfunc  # noqa: F401
    return sys.modules["mlflow.pyfunc"]


# --- registering ---------------------------------------------------------------------------------


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
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus, Metric
    from mlflow.models import Model
    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS
    from mlflow.utils.time import get_current_time_millis

    name = model_name(scenario)
    release_id = meta["release_id"]
    client = _client(tracking_uri, registry_uri)

    own_run = run_id is None
    if own_run:
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
        with tempfile.TemporaryDirectory(prefix="reef-register-") as tmp:
            staged = _stage(path, meta, Path(tmp) / DATA_DIR)
            local = Path(tmp) / "model"
            _pyfunc().save_model(
                path=str(local),
                loader_module=__name__,
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
            with _s3_endpoint(s3_endpoint_url):
                client.log_model_artifacts(logged.model_id, str(local))
        client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
        client.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step=0)])
        if metrics:
            now = get_current_time_millis()
            client.log_batch(
                run_id,
                metrics=[
                    Metric(k, float(v), now, 0, model_id=logged.model_id)
                    for k, v in metrics.items()
                ],
            )

        _ensure_registered_model(client, name)
        # Source is the artifact location, not "models:/<model_id>": MLflow's SQL registry
        # resolves the latter through a client on the process-global tracking URI.
        version = client.create_model_version(
            name,
            source=logged.artifact_location,
            run_id=run_id,
            tags=tags,
            description=_description(meta, metrics),
            model_id=logged.model_id,
        )
        client.set_logged_model_tags(
            logged.model_id,
            {MLFLOW_MODEL_VERSIONS: json.dumps([{"name": name, "version": version.version}])},
        )
    except BaseException:
        if logged is not None:
            _quietly(client.finalize_logged_model, logged.model_id, LoggedModelStatus.FAILED)
        if own_run:
            _quietly(client.set_terminated, run_id, "FAILED")
        raise
    if own_run:
        client.set_terminated(run_id, "FINISHED")
    uri = f"models:/{name}/{version.version}"
    log.info("registered %s release %s as %s", meta["kind"], release_id, uri)
    return uri


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


def register_candidate(
    tracking_uri: str,
    scenario: str,
    release_id: str,
    path: str | Path,
    *,
    kind: str,
    parent_id: str | None,
    content_hash: str,
    recipe: str,
    dataset_id: str | None,
    metrics: Mapping[str, float],
    gate: str,
    run_id: str | None = None,
    base_model: str | Path | None = None,
    experiment: str | None = None,
    artifact_location: str | None = None,
    registry_uri: str | None = None,
    s3_endpoint_url: str | None = None,
    extra: Mapping[str, str | None] | None = None,
) -> str:
    """Log the candidate at `path` (an adapter or full model directory, or a harness tree) as
    a pyfunc model and register it as a new version of ``reef-<scenario>``, tagged with the
    release's ids, gate decision and metrics and ``reef.status=candidate``.

    Logged under run `run_id` when given; otherwise under a new run in `experiment` (default
    ``reef/<scenario>``), created at `artifact_location` if it does not exist yet. `base_model`
    (a model directory, or a spec such as "tiny") is what an adapter is loaded onto; for an
    adapter it defaults to the ``base_model_name_or_path`` in its adapter_config.json.
    Registering a release id again returns the existing version (same content hash) or raises
    Conflict. `extra` adds fields to reef_release.json and ``reef.<key>`` tags (a harness
    names the weights it is served with). Returns ``models:/reef-<scenario>/<version>``.
    """
    if kind not in CANDIDATE_KINDS:
        raise ValueError(f"kind must be one of {', '.join(CANDIDATE_KINDS)}, not '{kind}'")
    src = Path(path).expanduser()
    if not src.is_dir():
        raise ValueError(f"candidate path {src} is not a directory")
    if kind == "adapter" and not (src / "adapter_config.json").is_file():
        raise ValueError(f"adapter {src} has no adapter_config.json")
    if kind == "checkpoint" and not (src / "config.json").is_file():
        raise ValueError(f"checkpoint {src} has no config.json")
    if base_model is None and kind == "adapter":
        base_model = json.loads((src / "adapter_config.json").read_text()).get(
            "base_model_name_or_path"
        )
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
        "recipe": recipe,
        "dataset_id": dataset_id,
        "gate": gate,
        **(extra or {}),
    }
    tags = {
        RELEASE_ID: release_id,
        PARENT_ID: parent_id or "",
        KIND: kind,
        CONTENT_HASH: content_hash,
        RECIPE: recipe,
        DATASET_ID: dataset_id or "",
        GATE: gate,
        STATUS: CANDIDATE,
        **{f"{METRIC_PREFIX}{k}": repr(float(v)) for k, v in metrics.items()},
        **{f"reef.{k}": str(v) for k, v in (extra or {}).items() if v},
    }
    return _register(
        tracking_uri,
        scenario,
        meta,
        src,
        tags,
        metrics,
        run_id=run_id,
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


# --- reading and tagging versions ---------------------------------------------------------------


def _version_of(client: Any, model_uri_or_version: str | int, scenario: str | None = None) -> Any:
    """The ModelVersion a ``models:/name/N`` or ``models:/name@alias`` URI (or, with
    `scenario`, a bare version number) names."""
    text = str(model_uri_or_version)
    if text.isdigit():
        if scenario is None:
            raise ValueError(f"a bare version ({text}) needs a scenario")
        return client.get_model_version(model_name(scenario), text)
    m = _MODEL_URI.match(text)
    if not m:
        raise ValueError(f"not a registered model URI (models:/<name>/<version>): '{text}'")
    if scenario is not None and m["name"] != model_name(scenario):
        raise ValueError(f"{text} is not a version of {model_name(scenario)}")
    if m["alias"]:
        return client.get_model_version_by_alias(m["name"], m["alias"])
    return client.get_model_version(m["name"], m["version"])


def set_champion(
    tracking_uri: str,
    scenario: str,
    model_uri_or_version: str | int,
    *,
    registry_uri: str | None = None,
) -> None:
    """Point the alias ``champion`` (the chain's head) at a version and tag it released. The
    caller moves the head in Reef's database first; this only mirrors it."""
    client = _client(tracking_uri, registry_uri)
    mv = _version_of(client, model_uri_or_version, scenario)
    # tag first: whatever `champion` points at is always tagged released
    client.set_model_version_tag(mv.name, mv.version, STATUS, RELEASED)
    client.set_registered_model_alias(mv.name, CHAMPION, mv.version)


def champion(
    tracking_uri: str, scenario: str, *, registry_uri: str | None = None
) -> tuple[int, str] | None:
    """(version, release id) of the version the alias ``champion`` names; None when there is no
    registered model or no champion yet."""
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri, registry_uri)
    name = model_name(scenario)
    try:
        # read the alias off the registered model: a missing alias is no error then (MLflow
        # answers get_model_version_by_alias for one with INVALID_PARAMETER_VALUE)
        version = client.get_registered_model(name).aliases.get(CHAMPION)
    except MlflowException as e:
        if _does_not_exist(e):
            return None
        raise
    if version is None:
        return None
    mv = client.get_model_version(name, str(version))
    return int(mv.version), mv.tags.get(RELEASE_ID, "")


def version_for_release(
    tracking_uri: str, scenario: str, release_id: str, *, registry_uri: str | None = None
) -> str | None:
    """``models:/reef-<scenario>/<version>`` of the version tagged with `release_id`, or None."""
    client = _client(tracking_uri, registry_uri)
    name = model_name(scenario)
    quoted = release_id.replace("'", "\\'")
    found = client.search_model_versions(
        f"name = '{name}' and tags.`{RELEASE_ID}` = '{quoted}'",
        order_by=["version_number DESC"],
        max_results=1,
    )
    return f"models:/{name}/{found[0].version}" if found else None


def get_tags(
    tracking_uri: str, model_uri: str, *, registry_uri: str | None = None
) -> dict[str, str]:
    """All tags of the version `model_uri` names."""
    mv = _version_of(_client(tracking_uri, registry_uri), model_uri)
    return dict(mv.tags)


def set_tag(
    tracking_uri: str, model_uri: str, key: str, value: str, *, registry_uri: str | None = None
) -> None:
    client = _client(tracking_uri, registry_uri)
    mv = _version_of(client, model_uri)
    client.set_model_version_tag(mv.name, mv.version, key, str(value))


def mark(
    tracking_uri: str, model_uri: str, status: str, *, registry_uri: str | None = None
) -> None:
    """Set ``reef.status`` ("candidate", "pending", "released", "rejected", ...)."""
    if not _STATUS.match(status):
        raise ValueError(f"invalid status '{status}' (lower-case word)")
    set_tag(tracking_uri, model_uri, STATUS, status, registry_uri=registry_uri)


def approval(tracking_uri: str, model_uri: str, *, registry_uri: str | None = None) -> str | None:
    """The human decision on a pending candidate: "approved", "rejected", or None while the
    ``reef.approval`` tag is absent (or holds anything else, which is logged)."""
    value = get_tags(tracking_uri, model_uri, registry_uri=registry_uri).get(APPROVAL)
    if value is None:
        return None
    decision = value.strip().lower()
    if decision in APPROVALS:
        return decision
    log.warning("%s: ignoring %s=%r (expected approved or rejected)", model_uri, APPROVAL, value)
    return None


# --- loading -------------------------------------------------------------------------------------


def load(
    tracking_uri: str,
    model_uri: str,
    *,
    registry_uri: str | None = None,
    s3_endpoint_url: str | None = None,
    base_model: str | Path | None = None,
) -> Any:
    """`mlflow.pyfunc.load_model` of a registered version, resolved through this tracking URI
    (not MLflow's global one). `base_model` overrides the base directory recorded at
    registration (another machine, another cache)."""
    client = _client(tracking_uri, registry_uri)
    mv = _version_of(client, model_uri)
    source = client.get_model_version_download_uri(mv.name, mv.version)
    config = {"base_model": str(base_model)} if base_model is not None else None
    with _s3_endpoint(s3_endpoint_url):
        return _pyfunc().load_model(source, model_config=config)


def _load_pyfunc(data_path: str, model_config: Mapping[str, Any] | None = None) -> ReleaseModel:
    """MLflow's loader-module entry point (`mlflow.pyfunc.load_model` calls it)."""
    config = dict(model_config or {})
    return ReleaseModel(Path(data_path), base_model=config.get("base_model"))


class ReleaseModel:
    """A release loaded for generation: the base model, with the adapter applied (PEFT) or the
    checkpoint in its place. `predict` answers chat prompts greedily, one at a time (so answers
    do not depend on what else is in the batch)."""

    def __init__(self, release_dir: Path, *, base_model: str | Path | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.dir = Path(release_dir)
        self.meta: dict[str, Any] = json.loads((self.dir / RELEASE_FILE).read_text())
        self.kind = self.meta["kind"]
        if self.kind == "harness":
            weights = self.meta.get("weights_model_uri") or "the base model"
            raise ValueError(
                f"release {self.meta['release_id']} is a harness: it holds prompts and tools, "
                f"not weights, and is served by Reef with the weights of {weights}"
            )
        weights = self.dir if self.kind == "checkpoint" else self._base_dir(base_model)
        model: Any = AutoModelForCausalLM.from_pretrained(weights)
        if self.kind == "adapter":
            from peft import PeftModel

            with warnings.catch_warnings():
                # peft 0.21 reads a property transformers 5 deprecated
                warnings.filterwarnings(
                    "ignore", message=".*is_gradient_checkpointing", category=FutureWarning
                )
                model = PeftModel.from_pretrained(model, self.dir)
        self.model = model.eval()
        has_tokenizer = (self.dir / "tokenizer_config.json").is_file()
        self.tokenizer = AutoTokenizer.from_pretrained(self.dir if has_tokenizer else weights)
        self._no_grad = torch.no_grad

    def _base_dir(self, override: str | Path | None) -> Path:
        from reef.errors import ConfigError
        from reef.models import resolve_model
        from reef.settings import EngineSettings

        ref = override if override is not None else self.meta.get("base_model")
        hint = 'load it with model_config={"base_model": "<model dir>"}'
        if not ref:
            raise ConfigError(f"release {self.meta['release_id']} records no base model; {hint}")
        try:
            return resolve_model(str(ref), EngineSettings().model_cache)
        except ConfigError as e:
            raise ConfigError(
                f"base model of release {self.meta['release_id']}: {e}; {hint}"
            ) from None

    def get_raw_model(self) -> Any:
        """The transformers model (a PeftModel for an adapter); PyFuncModel.get_raw_model
        returns it."""
        return self.model

    def predict(self, model_input: Any, params: Mapping[str, Any] | None = None) -> list[str]:
        """Replies to `model_input`: a list of prompts, each a string (one user message), a
        list of chat messages, or ``{"messages": [...]}``. `params`: ``max_new_tokens``."""
        max_new = int((params or {}).get("max_new_tokens") or DEFAULT_MAX_NEW_TOKENS)
        return [self._generate(_messages(p), max_new) for p in _prompts(model_input)]

    def _generate(self, messages: list[dict[str, Any]], max_new_tokens: int) -> str:
        tok = self.tokenizer
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        enc = tok(text, return_tensors="pt", add_special_tokens=False)
        with self._no_grad():
            out = self.model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
            )
        return str(tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True))


def _prompts(model_input: Any) -> Sequence[Any]:
    if isinstance(model_input, (str, dict)):
        return [model_input]
    if hasattr(model_input, "to_dict") and hasattr(model_input, "columns"):  # a DataFrame
        column = "messages" if "messages" in model_input.columns else model_input.columns[0]
        return list(model_input[column])
    return list(model_input)


def _messages(prompt: Any) -> list[dict[str, Any]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, Mapping):
        if "messages" in prompt:
            return list(prompt["messages"])
        return [dict(prompt)]  # one message
    return [dict(m) for m in prompt]
