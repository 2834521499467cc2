"""The release chain's operations: the one way from a candidate to a release.

Every caller that registers a candidate or moves a head goes through `ReleaseChain`: the
evolve, harness and instruct flows (in a worker, reaching the engine over its admin routes),
the promote, rollback and harness routes of `reef serve` (in-process, through the same
Protocol), and so the CLI. A chain owns what those steps share: the settings, the store, the
artifact store, the engine target and a cache of harness trees.

- `add_weights_candidate` / `add_harness_candidate`: register (deploy.candidates).
- `publish`: stage → verify → compare-and-swap → refresh (deploy.release), then the
  candidate's status and the MLflow alias `champion`.
- `reject`, `rollback`, `promote`, `release_harness`: the other ways a candidate's status or
  the head changes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from pathlib import Path

from deploy.candidates import (
    harness_candidate,
    harness_release,
    harness_version,
    promoted,
    rolled_back,
    store_harness,
    weights_candidate,
    weights_version,
)
from deploy.engine import EngineAdmin, EngineTarget
from deploy.release import deploy
from reef import registry
from reef.artifacts import ArtifactStore, artifacts_for
from reef.errors import BadRequest, Conflict, ReefError
from reef.gate import Decision
from reef.harness import Harness, HarnessCache, adds_executable
from reef.records import Candidate, Release
from reef.settings import Settings
from reef.store.base import Store
from reef.store.sql import open_store

log = logging.getLogger(__name__)


class ReleaseChain:
    """Registering candidates and moving heads, for one process. Blocking: call it from a
    worker thread in async code."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        artifacts: ArtifactStore,
        engine: EngineTarget,
        harnesses: HarnessCache | None = None,
    ):
        self.settings = settings
        self.store = store
        self.artifacts = artifacts
        self.engine = engine
        self.cache_dir = (settings.server.state_dir / "cache").resolve()
        self.harnesses = harnesses or HarnessCache(artifacts, self.cache_dir)
        self._owned: list[Store | EngineAdmin] = []

    @classmethod
    def for_settings(cls, settings: Settings) -> ReleaseChain:
        """A worker's chain: its own store connection, the serving engine over its admin
        routes. `close()` it when done."""
        store = open_store(settings.database_url)
        admin = EngineAdmin.for_settings(settings)
        chain = cls(settings, store, artifacts_for(settings), admin)
        chain._owned = [store, admin]
        return chain

    def close(self) -> None:
        for part in self._owned:
            part.close()
        self._owned = []

    def __enter__(self) -> ReleaseChain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # reading ------------------------------------------------------------------------------
    def files(self, release: Release) -> Path | None:
        """A local copy of the weights files `release` serves (None for the base): from the
        artifact store by its key, or a local directory an operator loaded."""
        if release.kind == "base":
            return None
        key = release.metadata.get("artifact_key")
        root = self.artifacts.uri("").rstrip("/") + "/"
        if not key and release.uri and release.uri.startswith(root):
            key = release.uri[len(root) :].strip("/")
        if key:
            return self.artifacts.fetch_tree(str(key), self.cache_dir / str(key))
        if release.uri and "://" not in release.uri.removeprefix("file://"):
            return Path(release.uri.removeprefix("file://"))
        return None

    def harness(self, release: Release) -> Harness:
        """The harness `release` serves (an empty one when it carries none)."""
        return self.harnesses.get(release) or Harness.empty()

    @property
    def keep(self) -> int:
        """How many newest releases of a chain stay loaded in the engine."""
        return max(2, self.settings.reef.max_staleness + 1)

    # registering --------------------------------------------------------------------------
    def add_weights_candidate(
        self,
        head: Release,
        files: Path,
        kind: str,
        decision: Decision,
        *,
        recipe: str,
        dataset_id: str,
        metrics: dict[str, float],
        run_id: str | None,
        base_model: str,
    ) -> Candidate:
        """Register trained files as a candidate made on `head`, with the gate's verdict."""
        candidate = weights_candidate(
            self.settings,
            self.artifacts,
            head,
            files,
            kind,
            decision,
            recipe=recipe,
            dataset_id=dataset_id,
            metrics=metrics,
            run_id=run_id,
            base_model=base_model,
        )
        return self.store.add_candidate(candidate)

    def add_harness_candidate(
        self,
        head: Release,
        harness: Harness,
        decision: Decision,
        *,
        recipe: str,
        dataset_id: str | None = None,
        metrics: dict[str, float] | None = None,
        run_id: str | None = None,
    ) -> Candidate:
        """Register a harness as a candidate made on `head` (it keeps the head's weights)."""
        candidate = harness_candidate(
            self.settings,
            self.artifacts,
            head,
            harness,
            decision,
            recipe=recipe,
            dataset_id=dataset_id,
            metrics=metrics,
            run_id=run_id,
        )
        return self.store.add_candidate(candidate)

    # moving the head ----------------------------------------------------------------------
    def publish(self, candidate: Candidate, operation: str | None = None) -> Release:
        """Deploy a pending candidate as the head; it is "published" after, "failed" (with the
        reason) when the deploy fails."""
        try:
            release = self._deploy(candidate.release(operation))
            self.store.set_candidate_status(
                candidate.scenario, candidate.id, "published", expected=candidate.status
            )
            return release
        except ReefError as e:
            with contextlib.suppress(ReefError):  # a promote may have claimed it meanwhile
                self.store.set_candidate_status(
                    candidate.scenario,
                    candidate.id,
                    "failed",
                    expected="pending",
                    message=e.message,
                )
            raise

    def reject(self, candidate: Candidate, note: str) -> Candidate:
        """A pending candidate declined (a human's no, or the approval timed out)."""
        current = self.store.get_candidate(candidate.scenario, candidate.id)
        if current.status == "pending":
            self.store.set_candidate_status(
                candidate.scenario, candidate.id, "rejected", expected="pending", message=note
            )
            self.mark(candidate, "rejected")
        return self.store.get_candidate(candidate.scenario, candidate.id)

    def mark(self, candidate: Candidate, status: str) -> None:
        """The candidate's status on its MLflow model version (`reef.status`)."""
        if candidate.model_uri:
            registry.mark(self.settings.tracking_uri, candidate.model_uri, status)

    def rollback(self, scenario: str, release_id: str) -> Release:
        """Republish an earlier release's content as the new head (operation "rollback")."""
        target = self.store.get_release(scenario, release_id)
        head = self.store.head_release(scenario)
        if target.id == head.id:
            raise Conflict(
                f"release {target.id} is already the head of '{scenario}'", code="is_head"
            )
        release = rolled_back(target, head)
        self._check_deployable(release)
        return self._deploy(self._mirrored(release))

    def promote(self, scenario: str, candidate_id: str) -> Release:
        """Publish a pending candidate (held by the manual gate or for review) on today's head."""
        cand = self.store.get_candidate(scenario, candidate_id)
        if cand.status != "pending":
            raise Conflict(
                f"candidate {cand.id} is {cand.status}, not pending", code="candidate_status"
            )
        release = promoted(cand, self.store.head_release(scenario))
        self._check_deployable(release)
        # claim the candidate first: a concurrent promote (or the paused flow) gets 409
        self.store.set_candidate_status(scenario, cand.id, "published", expected="pending")
        try:
            return self._deploy(release)
        except Exception as e:
            self.store.set_candidate_status(
                scenario,
                cand.id,
                "pending",
                expected="published",
                message=f"promote failed: {e}",
            )
            raise

    def release_harness(self, scenario: str, harness: Harness) -> Release | Candidate:
        """An operator's harness, released on the head's weights; one that adds executable
        content is held as a pending candidate for review instead (promote releases it)."""
        self.store.ensure_scenario(scenario)  # as a first call would
        head = self.store.head_release(scenario)
        current = self.harness(head)
        if harness.content_hash() == current.content_hash():
            raise Conflict("the head already serves this harness", code="harness_unchanged")
        added = adds_executable(current, harness)
        if added:  # never served before someone has read it
            reason = f"adds executable content ({', '.join(added)}): held for review"
            decision = Decision(
                status="pending", policy="manual", test="review", reason=reason, n=0
            )
            return self.add_harness_candidate(head, harness, decision, recipe="admin")
        ref = store_harness(self.artifacts, scenario, harness)
        release = harness_release(head, ref)
        model_uri = harness_version(self.settings, release, harness, recipe="admin", gate="harness")
        return self._deploy(release, model_uri=model_uri)

    # steps --------------------------------------------------------------------------------
    def _check_deployable(self, release: Release) -> None:
        """Before anything is registered: an engine that cannot load releases (upstream) serves
        base releases only, with or without a harness."""
        if release.kind != "base" and not getattr(self.engine, "loads_releases", True):
            raise BadRequest(
                f"the {getattr(self.engine, 'kind', 'serving')} engine cannot load "
                f"{release.kind} releases",
                code="not_deployable",
            )

    def _mirrored(self, release: Release) -> Release:
        """`release` with a model version in MLflow (the chain's mirror), before it is
        published: its harness files when it changed only the harness, else its weights."""
        if "weights_release_id" in release.metadata and self.harnesses.get(release) is not None:
            model_uri = harness_version(
                self.settings,
                release,
                self.harness(release),
                recipe=release.recipe or "",
                gate=release.operation,
                dataset_id=release.dataset_id,
            )
        else:
            model_uri = weights_version(self.settings, release, self.files(release))
        return dataclasses.replace(release, model_uri=model_uri)

    def _deploy(self, release: Release, model_uri: str | None = None) -> Release:
        if model_uri is not None:
            release = dataclasses.replace(release, model_uri=model_uri)

        def champion(published: Release) -> None:
            if published.model_uri:
                registry.set_champion(
                    self.settings.tracking_uri, published.scenario, published.model_uri
                )

        published, timings = deploy(
            self.store, self.engine, release, keep=self.keep, mirror=champion
        )
        log.info(
            "release %s (seq %d) is the head of %s: %s",
            published.id,
            published.seq,
            published.scenario,
            timings,
        )
        return published
