"""Deleting a scenario: the database first, then everything it left outside the database.

`Store.delete_scenario` removes the scenario's rows (records, reports, releases, candidates,
jobs) and writes a tombstone in the same transaction: that commit is the deletion. What the
database cannot take with it goes next, by `finish`:

- artifact-store keys under ``datasets/<s>/``, ``releases/<s>/``, ``harness/<s>/``,
  ``harness-eval/<s>/``, ``archive/<s>/``, ``figures/<s>/`` and ``discover/<s>/`` (dataset
  snapshots, release files, harness trees, evaluation caches, rows retention archived, demo
  figures, discovery archives),
  and this process's local copies of them under ``<state_dir>/cache/``;
- MLflow's registered model ``reef-<s>`` with its versions, and the runs and logged models of
  experiment ``reef/<s>`` with their artifacts (`reef.registry.removal`).

A serving process runs `finish` off the request path (`Cleaner`, a background task): the
DELETE answers once the deletion is committed, however slow S3 or MLflow are. The tombstone is
dropped only once all of that is gone. When a step fails (S3 or MLflow
unreachable) or never runs (the process died after the commit), the tombstone stays and
`collect_garbage` — the `reef gc` command — runs the same steps again later; each is
idempotent. While a tombstone exists the name cannot be used again, so a new scenario never
shares keys with the remains of an old one.
"""

from __future__ import annotations

import logging
import shutil
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reef.background import BackgroundTask
from reef.errors import NotFound

if TYPE_CHECKING:
    from reef.artifacts import ArtifactStore
    from reef.registry.removal import Removed
    from reef.settings import Settings
    from reef.store.scenarios import ScenarioStore

log = logging.getLogger(__name__)

# Artifact-store key prefixes that hold one scenario's files under `<prefix>/<scenario>/`.
ARTIFACT_PREFIXES = (
    "datasets",
    "releases",
    "harness",
    "harness-eval",
    "archive",
    "figures",  # demo and bench figures per release (reef.figures)
    "discover",  # the discovery harness's archives (demo.discover)
)


@dataclass(frozen=True)
class Cleanup:
    """What removing one deleted scenario's remains did; `error` says why it is not done."""

    scenario: str
    artifacts: int = 0  # artifact-store keys removed
    mlflow: Removed | None = None
    error: str | None = None
    note: str | None = None

    @property
    def done(self) -> bool:
        return self.error is None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["done"] = self.done
        return out


def purge(settings: Settings, artifacts: ArtifactStore, scenario: str) -> Cleanup:
    """Remove the scenario's files and MLflow entries (each step idempotent). Raises what the
    artifact store or MLflow raise."""
    removed = sum(artifacts.delete_prefix(f"{p}/{scenario}") for p in ARTIFACT_PREFIXES)
    cache = settings.server.state_dir / "cache"
    for prefix in ARTIFACT_PREFIXES:
        shutil.rmtree(cache / prefix / scenario, ignore_errors=True)
    mlflow = None
    if _mlflow_may_hold_anything(settings.tracking_uri):
        from reef.registry.removal import remove_scenario

        mlflow = remove_scenario(
            settings.tracking_uri, scenario, s3_endpoint_url=settings.artifacts.s3_endpoint_url
        )
    return Cleanup(scenario, artifacts=removed, mlflow=mlflow)


def finish(
    store: ScenarioStore, settings: Settings, artifacts: ArtifactStore, scenario: str
) -> Cleanup:
    """Purge a deleted scenario's remains and drop its tombstone; a failure leaves the
    tombstone for `reef gc` and is returned (and logged), not raised."""
    try:
        store.get_scenario(scenario)
    except NotFound:
        pass
    else:
        # Created again meanwhile (only a race with the deletion's commit allows that): its
        # keys are the new scenario's now. Leave them; deleting the scenario again removes all.
        store.finish_deletion(scenario)
        return Cleanup(scenario, note="the scenario exists again: its files were left alone")
    try:
        done = purge(settings, artifacts, scenario)
    except Exception as e:
        message = f"{type(e).__name__}: {e}"
        log.warning("removing deleted scenario %s failed (reef gc retries): %s", scenario, message)
        return Cleanup(scenario, error=message[:2000])
    store.finish_deletion(scenario)
    log.info(
        "deleted scenario %s: %d artifact keys, MLflow %s", scenario, done.artifacts, done.mlflow
    )
    return done


def collect_garbage(
    store: ScenarioStore, settings: Settings, artifacts: ArtifactStore
) -> list[Cleanup]:
    """Finish every pending deletion (oldest first): what `reef gc` runs."""
    return [finish(store, settings, artifacts, d.scenario) for d in store.pending_deletions()]


class Cleaner:
    """`finish` for the scenarios a serving process deleted, one after another on a thread of
    its own: `add` returns at once. A name still queued when the process stops, or whose
    clean-up failed, keeps its tombstone for `reef gc`."""

    def __init__(self, store: ScenarioStore, settings: Settings, artifacts: ArtifactStore):
        self.store = store
        self.settings = settings
        self.artifacts = artifacts
        self._queue: list[str] = []
        self._lock = threading.Lock()
        self.task = BackgroundTask("scenario-cleanup", self._step)

    def add(self, scenario: str) -> None:
        with self._lock:
            self._queue.append(scenario)
        self.task.trigger()

    def _step(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    return
                scenario = self._queue.pop(0)
            finish(self.store, self.settings, self.artifacts, scenario)

    def start(self) -> None:
        self.task.start()

    def stop(self) -> None:
        self.task.stop()


def _mlflow_may_hold_anything(tracking_uri: str) -> bool:
    """False for a SQLite tracking store that does not exist yet: nothing to remove there, and
    opening it would create it."""
    if not tracking_uri.startswith("sqlite:///"):
        return True
    return Path(tracking_uri.removeprefix("sqlite:///").split("?", 1)[0]).exists()
