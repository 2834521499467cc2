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

Each change that operators' webhooks hear of (reef.events) hands its events to the store's
write of that change, so they are stored in its transaction.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reef import events, registry
from reef.artifacts import ArtifactStore, artifacts_for
from reef.deploy.candidates import (
    harness_candidate,
    harness_release,
    harness_version,
    promoted,
    rolled_back,
    store_harness,
    weights_candidate,
    weights_version,
)
from reef.deploy.engine import EngineTarget, Fleet, engines_for
from reef.deploy.release import deploy
from reef.errors import BadRequest, Conflict, NotFound, ReefError
from reef.gate import Decision
from reef.harness import Harness, HarnessCache, changed_executable
from reef.provenance import Provenance
from reef.records import Candidate, Consumption, Release, utcnow
from reef.settings import Settings
from reef.store.base import Store
from reef.store.events import Delivery
from reef.store.sql import open_store
from reef.variants import variant_name

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
        self._owned: list[Any] = []  # what close() closes

    @classmethod
    def for_settings(cls, settings: Settings) -> ReleaseChain:
        """A worker's chain: its own store connection, the serving engines over their admin
        routes (engine.fleet.admin_urls, else reef.engine_url, and the registered ones with
        engine.fleet.registry). `close()` it when done."""
        store = open_store(settings.database_url)
        engines = engines_for(settings, store=store)
        chain = cls(settings, store, artifacts_for(settings), engines)
        chain._owned = [store, engines]
        return chain

    def close(self) -> None:
        for part in self._owned:
            close = getattr(part, "close", None)
            if close is not None:
                close()
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
        provenance: Provenance,
    ) -> Candidate:
        """Register trained files as a candidate made on `head`, with the gate's verdict and
        where it came from (`provenance.metadata` joins its release's metadata)."""
        candidate = weights_candidate(
            self.settings, self.artifacts, head, files, kind, decision, provenance
        )
        return self._stored(candidate)

    def add_harness_candidate(
        self,
        head: Release,
        harness: Harness,
        decision: Decision,
        provenance: Provenance,
    ) -> Candidate:
        """Register a harness as a candidate made on `head` (it keeps the head's weights)."""
        candidate = harness_candidate(
            self.settings, self.artifacts, head, harness, decision, provenance
        )
        return self._stored(candidate)

    def _stored(self, candidate: Candidate) -> Candidate:
        """`candidate` written to the store. When the write fails (the database away; the run's
        task retries with a new candidate), its MLflow version is tagged UNRECORDED, for the
        scenario's next recover to settle: each failed try left a version nothing names."""
        try:
            return self.store.add_candidate(candidate, self._registered(candidate))
        except BaseException as e:
            if candidate.model_uri:
                try:
                    registry.set_tag(
                        self.settings.tracking_uri, candidate.model_uri, registry.UNRECORDED, "true"
                    )
                except Exception as tagging:  # MLflow away too: the version stays, logged
                    log.warning("tagging %s unrecorded failed: %s", candidate.model_uri, tagging)
                log.warning(
                    "candidate %s not stored (%s): %s tagged %s",
                    candidate.id,
                    e,
                    candidate.model_uri,
                    registry.UNRECORDED,
                )
            raise

    # moving the head ----------------------------------------------------------------------
    def publish(
        self,
        candidate: Candidate,
        operation: str | None = None,
        *,
        approval: dict[str, Any] | None = None,
        attempts: int = 1,
        retry_delay_s: float = 5.0,
        consumptions: Sequence[Consumption] = (),
    ) -> Release:
        """Deploy a pending candidate as the head, exactly once.

        Idempotent per candidate: when its release is already on the chain (an earlier attempt
        moved the head and stopped before its status was written), this finishes the job
        (status "published", the MLflow alias) instead of deploying again. A candidate that
        failed or was rejected is never published. A failed attempt whose error may pass
        (the engine unreachable or failing, 5xx, anything not a ReefError) is retried up to
        `attempts` times in all; the candidate is marked "failed" only when the last attempt
        fails, or at once for an error that will not pass (4xx: the head moved, a misfit).
        `approval` (who approved a held candidate, and how) is recorded on the release;
        `consumptions` (the receipts of the batch the candidate was trained on) are written in
        the head's compare-and-swap, so the batch is consumed if and only if the head moved."""
        scenario = candidate.scenario
        for attempt in range(1, attempts + 1):
            current = self.store.get_candidate(scenario, candidate.id)
            done = self._on_chain(scenario, candidate.id)
            if done is not None:
                return self._finish(current, done)
            if current.status != "pending":
                raise Conflict(
                    f"candidate {candidate.id} is {current.status}: it is not published",
                    code="candidate_status",
                )
            try:
                release = current.release(operation)
                if approval is not None:
                    release = dataclasses.replace(
                        release, metadata={**release.metadata, "approval": approval}
                    )
                promoted = self._promoted(current, approval)
                release = self._deploy(release, also=promoted, consumptions=consumptions)
                return self._finish(current, release, redo=False)
            except Exception as e:
                final = attempt == attempts or (isinstance(e, ReefError) and e.status < 500)
                message = e.message if isinstance(e, ReefError) else f"{type(e).__name__}: {e}"
                if not final:
                    log.warning(
                        "deploying %s failed (attempt %d of %d), retrying: %s",
                        candidate.id,
                        attempt,
                        attempts,
                        message,
                    )
                    time.sleep(retry_delay_s)
                    continue
                if self._on_chain(scenario, candidate.id) is None:
                    with contextlib.suppress(ReefError):  # a promote may have claimed it
                        self.store.set_candidate_status(
                            scenario, candidate.id, "failed", expected="pending", message=message
                        )
                raise
        raise AssertionError("unreachable")  # the loop returns or raises

    def reject(self, candidate: Candidate, note: str) -> Candidate:
        """A pending candidate declined (a human's no, or the approval timed out)."""
        current = self.store.get_candidate(candidate.scenario, candidate.id)
        if current.status == "pending":
            declined = dataclasses.replace(current, status="rejected", message=note)
            told = events.deliveries(
                self.settings.events,
                "candidate.rejected",
                candidate.scenario,
                events.candidate_data(declined),
            )
            self.store.set_candidate_status(
                candidate.scenario,
                candidate.id,
                "rejected",
                expected="pending",
                message=note,
                events=told,
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

    def promote(self, scenario: str, candidate_id: str, *, by: str) -> Release:
        """Publish a pending candidate (held by the manual gate or for review) on today's head,
        approved by `by` (a Reef admin token's name, recorded on the release). A promote that
        moved the head but stopped before the candidate's status was written is finished by
        the next one; promoting a published candidate again is a Conflict."""
        cand = self.store.get_candidate(scenario, candidate_id)
        done = self._on_chain(scenario, cand.id)
        if done is not None and cand.status == "pending":
            return self._finish(cand, done)
        if cand.status != "pending":
            raise Conflict(
                f"candidate {cand.id} is {cand.status}, not pending", code="candidate_status"
            )
        release = promoted(cand, self.store.head_release(scenario))
        approval = {"by": by, "via": "reef", "at": utcnow().isoformat()}
        release = dataclasses.replace(release, metadata={**release.metadata, "approval": approval})
        self._check_deployable(release)
        # claim the candidate first: a concurrent promote (or the paused flow) gets 409
        self.store.set_candidate_status(scenario, cand.id, "published", expected="pending")
        try:
            return self._deploy(release)
        except Exception as e:
            if self._on_chain(scenario, cand.id) is None:  # the head did not move: try again
                self.store.set_candidate_status(
                    scenario,
                    cand.id,
                    "pending",
                    expected="published",
                    message=f"promote failed: {e}",
                )
            raise

    def release_harness(self, scenario: str, harness: Harness) -> Release | Candidate:
        """An operator's harness, released on the head's weights; one whose executable files
        differ from the head's (path -> sha256) is held as a pending candidate for review
        instead (promote releases it)."""
        self.store.ensure_scenario(scenario)  # as a first call would
        head = self.store.head_release(scenario)
        current = self.harness(head)
        if harness.content_hash() == current.content_hash():
            raise Conflict("the head already serves this harness", code="harness_unchanged")
        changed = changed_executable(current, harness)
        if changed:  # never served before someone has read it
            reason = f"changes executable content ({', '.join(changed)}): held for review"
            decision = Decision(
                status="pending", policy="manual", test="review", reason=reason, n=0
            )
            return self.add_harness_candidate(head, harness, decision, Provenance(recipe="admin"))
        ref = store_harness(self.artifacts, scenario, harness)
        release = harness_release(head, ref)
        model_uri = harness_version(
            self.settings, release, harness, Provenance(recipe="admin"), gate="harness"
        )
        return self._deploy(release, model_uri=model_uri)

    # rollouts (deploy.rollout decides; these move the statuses and the head) ---------------
    def start_canary(self, candidate: Candidate, rollout: dict[str, Any]) -> Candidate:
        """Stage and verify an accepted candidate in the engine, then make it the scenario's
        canary (compare-and-swap pending → canary). The head does not move: the canary serves
        a share of sessions (reef.rollouts) until a promote or a rollback ends it."""
        scenario = candidate.scenario
        live = self.store.list_candidates(scenario, "canary")
        if live:
            raise Conflict(
                f"scenario '{scenario}' has a live canary ({live[0].id}): end it first",
                code="rollout_live",
            )
        release = candidate.release()
        self._check_deployable(release)
        if release.kind == "checkpoint" and self.settings.engine.kind == "vllm":
            # One vLLM engine holds one set of full weights: both arms cannot be served.
            raise BadRequest(
                "a full-weights canary needs a second engine: a vLLM engine holds one set of "
                "full weights, so it cannot serve the canary beside the head; train a LoRA "
                "adapter, or set rollout.mode to immediate",
                code="canary_needs_second_engine",
            )
        if release.kind != "base":
            if not release.uri:
                raise ReefError(f"candidate {candidate.id} has no files to stage")
            name = variant_name(scenario, release.weights_id)
            # on every engine that serves the scenario, or (unstaged again) on none
            Fleet.of(self.engine).stage(name, release.kind, release.uri)
        state = {
            **rollout,
            "control_release_id": candidate.parent_id,
            "started_at": utcnow().isoformat(),
        }
        started = self.store.set_candidate_status(
            scenario,
            candidate.id,
            "canary",
            expected="pending",
            gate={**candidate.gate, "rollout": state},
        )
        self.mark(candidate, "canary")
        return started

    def canary(self, scenario: str) -> Candidate:
        """The scenario's live canary (NotFound when none is live)."""
        live = self.store.list_candidates(scenario, "canary")
        if not live:
            raise NotFound(f"scenario '{scenario}' has no live canary", code="no_rollout")
        return live[0]

    def promote_canary(self, scenario: str, *, by: str, verdict: dict[str, Any]) -> Release:
        """The canary becomes the head through `publish` (compare-and-swap on the head it was
        made on): refused, and the candidate marked failed, when the head moved meanwhile."""
        cand = self.canary(scenario)
        cand = self.store.set_candidate_status(
            scenario, cand.id, "pending", expected="canary", message=None
        )
        approval = {"by": by, "via": "rollout", "at": utcnow().isoformat(), "rollout": verdict}
        return self.publish(cand, approval=approval)

    def roll_back_canary(
        self, scenario: str, *, by: str, reason: str, verdict: dict[str, Any]
    ) -> Release:
        """Retire the canary (compare-and-swap canary → rolled_back) and record it on the chain:
        a rollback release that republishes the head's content, with the reason and numbers."""
        cand = self.canary(scenario)
        retired = dataclasses.replace(cand, status="rolled_back", message=reason)
        data = events.candidate_data(retired, by=by, verdict=verdict)
        told = events.deliveries(self.settings.events, "rollout.rolled_back", scenario, data)
        self.store.set_candidate_status(
            scenario, cand.id, "rolled_back", expected="canary", message=reason, events=told
        )
        self.mark(cand, "rolled_back")
        head = self.store.head_release(scenario)
        release = rolled_back(head, head)
        note = {**verdict, "canary_release_id": cand.id, "reason": reason, "by": by}
        release = dataclasses.replace(release, metadata={**release.metadata, "rollout": note})
        return self._deploy(self._mirrored(release))

    def end_split(self, scenario: str, keep: str | None, note: dict[str, Any]) -> Release:
        """End an A/B split (deploy.rollout.end_ab): a rollback release republishing `keep`'s
        content (None: the head's), whose `metadata.rollout` names the pair and the numbers."""
        head = self.store.head_release(scenario)
        target = self.store.get_release(scenario, keep) if keep is not None else head
        release = rolled_back(target, head)
        release = dataclasses.replace(release, metadata={**release.metadata, "rollout": note})
        self._check_deployable(release)
        return self._deploy(self._mirrored(release))

    # steps --------------------------------------------------------------------------------
    def recover(self, scenario: str) -> list[str]:
        """Finish or retire what runs that died (a killed worker) left of the scenario's
        candidates: one on the chain but still "pending" (the run stopped between the head's
        swap and its status) is finished as publish would (its status, the MLflow alias); one
        the gate accepted that is not on the chain and whose parent is no longer the head can
        never be published (its swap would fail): "failed", with why. A candidate held for a
        human (manual gate, review) is left to them: promote puts it on today's head. Last,
        MLflow's `champion` alias is moved to the head if it names another release. Returns
        what it did, a line each."""
        done: list[str] = []
        head = self.store.head_release(scenario).id
        for cand in self.store.list_candidates(scenario, status="pending"):
            release = self._on_chain(scenario, cand.id)
            if release is not None:
                self._finish(cand, release)
                done.append(f"{cand.id}: on the chain, marked published")
            elif cand.gate.get("status") == "accepted" and cand.parent_id != head:
                why = "its run ended before publishing it, and the head has moved on since"
                with contextlib.suppress(Conflict):  # decided meanwhile
                    self.store.set_candidate_status(
                        scenario, cand.id, "failed", expected="pending", message=why
                    )
                    done.append(f"{cand.id}: {why}: marked failed")
        if (line := self._mirror_head(scenario)) is not None:
            done.append(line)
        done += self._settle_unrecorded(scenario)
        for line in done:
            log.warning("recovered what a run left of %s: %s", scenario, line)
        return done

    def _settle_unrecorded(self, scenario: str) -> list[str]:
        """The scenario's MLflow versions tagged UNRECORDED (a candidate write that failed):
        deleted when the store has no such candidate, untagged when it has (the write went
        through and only its answer was lost). MLflow away: logged, the next recover tries."""
        uri = self.settings.tracking_uri
        try:
            versions = registry.unrecorded(uri, scenario)
        except Exception as e:
            log.warning("looking for unrecorded MLflow versions of %s failed: %s", scenario, e)
            return []
        done = []
        for model_uri, release_id in versions:
            try:
                self.store.get_candidate(scenario, release_id)
                recorded = True
            except NotFound:
                recorded = False
            try:
                registry.forget_unrecorded(uri, model_uri, recorded)
            except Exception as e:
                log.warning("settling %s failed: %s", model_uri, e)
                continue
            what = "its candidate is stored: untagged" if recorded else "no candidate: deleted"
            done.append(f"{model_uri} (unrecorded) {what}")
        return done

    def _mirror_head(self, scenario: str) -> str | None:
        """Point MLflow's `champion` alias at the head when it names another version: a
        publish whose alias move failed (MLflow unreachable after the head's swap: the deploy
        logs it and goes on, the chain being the truth) left it on the release before. What
        it did, or None; MLflow still away is logged, and the next recover tries again."""
        head = self.store.head_release(scenario)
        if not head.model_uri:
            return None
        try:
            current = registry.champion(self.settings.tracking_uri, scenario)
            named = head.model_uri.rsplit("/", 1)[-1]  # models:/<name>/<version>
            if current is not None and (current[1] == head.id or str(current[0]) == named):
                return None
            self._champion(head)
        except Exception as e:
            log.warning("mirroring the head of %s to MLflow failed: %s", scenario, e)
            return None
        was = "none" if current is None else current[1]
        return f"MLflow's champion alias named {was}: moved to the head {head.id}"

    def _champion(self, release: Release) -> None:
        """MLflow's `champion` alias on `release`'s model version (a release without one, a
        harness, has none to point at)."""
        if release.model_uri:
            registry.set_champion(self.settings.tracking_uri, release.scenario, release.model_uri)

    def _on_chain(self, scenario: str, release_id: str) -> Release | None:
        try:
            return self.store.get_release(scenario, release_id)
        except NotFound:
            return None

    def _finish(self, candidate: Candidate, release: Release, *, redo: bool = True) -> Release:
        """What follows a candidate's compare-and-swap, safe to redo: its status, and (`redo`,
        when an earlier attempt stopped after the swap) the MLflow alias and the engine's
        refresh while it is still the head."""
        if candidate.status != "published":
            with contextlib.suppress(Conflict):  # a concurrent finisher wrote it first
                self.store.set_candidate_status(
                    candidate.scenario, candidate.id, "published", expected=candidate.status
                )
        if redo and self.store.head_release(release.scenario).id == release.id:
            self._champion(release)
            self.engine.refresh(release.scenario)
        return release

    def _check_deployable(self, release: Release) -> None:
        """Before anything is registered: an engine that cannot load releases (upstream) serves
        base releases only, with or without a harness."""
        if release.kind != "base" and not self.engine.loads_releases:
            raise BadRequest(
                f"the {getattr(self.engine, 'kind', 'serving')} engine cannot load "
                f"{release.kind} releases",
                code="not_deployable",
            )

    def _mirrored(self, release: Release) -> Release:
        """`release` with a model version in MLflow (the chain's mirror), before it is
        published: its harness files when it changed only the harness, else its weights."""
        if "weights_release_id" in release.metadata and self.harnesses.get(release) is not None:
            made = Provenance(recipe=release.recipe or "", dataset_id=release.dataset_id)
            model_uri = harness_version(
                self.settings, release, self.harness(release), made, gate=release.operation
            )
        else:
            model_uri = weights_version(self.settings, release, self.files(release))
        return dataclasses.replace(release, model_uri=model_uri)

    def _registered(self, candidate: Candidate) -> list[Delivery]:
        return events.registered(self.settings.events, candidate)

    def _promoted(self, candidate: Candidate, approval: dict[str, Any] | None) -> list[Delivery]:
        """rollout.promoted when a canary's rollout is what publishes `candidate`."""
        if not approval or approval.get("via") != "rollout":
            return []
        data = events.candidate_data(
            dataclasses.replace(candidate, status="published"),
            release_id=candidate.id,
            by=approval.get("by"),
            verdict=approval.get("rollout"),
        )
        return events.deliveries(self.settings.events, "rollout.promoted", candidate.scenario, data)

    def _deploy(
        self,
        release: Release,
        model_uri: str | None = None,
        also: Sequence[Delivery] = (),
        consumptions: Sequence[Consumption] = (),
    ) -> Release:
        """Deploy `release` (deploy.release.deploy); release.published, `also` and
        `consumptions` are stored with the head's move."""
        if model_uri is not None:
            release = dataclasses.replace(release, model_uri=model_uri)
        told = [*events.published(self.settings.events, release), *also]
        published, timings = deploy(
            self.store,
            self.engine,
            release,
            keep=self.keep,
            mirror=self._champion,
            events=told,
            consumptions=consumptions,
        )
        log.info(
            "release %s (seq %d) is the head of %s: %s",
            published.id,
            published.seq,
            published.scenario,
            timings,
        )
        return published
