"""Deploy a release: stage it in the engines, verify it, then move the head by compare-and-swap.

The head is what a scenario serves, so it moves only after every engine that serves it (one, or
a deploy.engine.Fleet) holds the release and a smoke generation on it succeeded there. If
loading or verifying fails on any of them (a ReefError, or anything else: torch, the OS), or
another publisher moved the head first (HeadMoved, 409), the staged variant is unloaded from
every engine this deploy loaded it on and the head stays where it was. Once the head has moved, the rest (refreshing the
scenario, the MLflow mirror, unloading variants outside the keep window) can be redone, so a
failure there is logged and never fails the deploy.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from reef import faults
from reef.deploy.engine import EngineTarget, Fleet
from reef.errors import ReefError
from reef.harness import harness_of
from reef.records import Consumption, Release
from reef.store.chain import ChainStore
from reef.store.events import Delivery
from reef.variants import variant_name

log = logging.getLogger(__name__)


def deploy(
    store: ChainStore,
    engine: EngineTarget,
    release: Release,
    *,
    keep: int = 2,
    mirror: Callable[[Release], Any] | None = None,
    events: Sequence[Delivery] = (),
    consumptions: Sequence[Consumption] = (),
) -> tuple[Release, dict[str, Any]]:
    """Stage, verify, publish (CAS on `release.parent_id`), mirror, retire; returns the stored
    release and the timings. `keep`: how many newest releases of the chain stay loaded;
    `events` (reef.events) and `consumptions` (the receipts of the batch it was trained on)
    are stored with the head's move, in its transaction."""
    timings: dict[str, Any] = {}
    release = _keep_harness(store, release)
    name = variant_name(release.scenario, release.weights_id)
    started = time.monotonic()
    fleet = Fleet.of(engine)
    # The engines this deploy loaded the variant on, and so must unload it from on failure. A
    # release that changed only the harness serves weights the engines may hold (and serve).
    staged: list[str] = []
    if release.kind != "base":
        if not release.uri:
            raise ReefError(f"release {release.id} has no files to deploy")
        # on every engine, or (unstaged again) on none
        stage = fleet.stage(name, release.kind, release.uri)
        staged = stage["staged"]
        timings["stage_s"] = round(time.monotonic() - started, 3)
        verified = stage["verify"]
        # one engine's answer, or each engine's by its label
        timings["verify"] = next(iter(verified.values())) if len(verified) == 1 else verified
    faults.reached("before_cas", release.scenario)
    try:
        published = store.publish_release(release, events, consumptions)
    except BaseException:  # any failure before the head moved (HeadMoved, a kill) unstages
        fleet.unstage(name, staged)
        raise
    faults.reached("after_cas", release.scenario)
    # The head has moved: what follows can be redone, so it never fails the deploy.
    try:
        engine.refresh(release.scenario)
    except Exception as e:
        log.warning("refreshing %s after release %s failed: %s", release.scenario, published.id, e)
        timings["refresh_error"] = str(e)
    timings["deploy_s"] = round(time.monotonic() - started, 3)
    if mirror is not None:
        try:
            mirror(published)
        except Exception as e:  # the chain is the truth; the mirror can be redone
            log.warning("mirroring release %s to MLflow failed: %s", published.id, e)
            timings["mirror_error"] = str(e)
    try:
        retire(store, engine, release.scenario, keep)
    except Exception as e:
        log.warning("retiring old variants of %s failed: %s", release.scenario, e)
    return published, timings


def retire(store: ChainStore, engine: EngineTarget, scenario: str, keep: int) -> list[str]:
    """Unload the scenario's variants that are not among its `keep` newest releases."""
    chain = store.list_releases(scenario)
    wanted = {variant_name(scenario, r.weights_id) for r in chain[-max(keep, 1) :]}
    gone = []
    for label, member in Fleet.of(engine).members:  # each engine holds its own set
        try:
            held = member.variants()
        except Exception as e:
            log.warning("listing the variants of engine %s failed: %s", label, e)
            continue
        for name in held:
            if name.startswith(f"{scenario}@") and name not in wanted:
                try:
                    member.unload(name)
                    gone.append(name)
                except Exception as e:
                    log.warning("unloading %s from engine %s failed: %s", name, label, e)
    return gone


def _keep_harness(store: ChainStore, release: Release) -> Release:
    """Weights trained on top of a head with a harness keep serving that harness."""
    if release.operation not in ("training", "promote") or harness_of(release) is not None:
        return release
    if release.parent_id is None:
        return release
    ref = harness_of(store.get_release(release.scenario, release.parent_id))
    if ref is None:
        return release
    return dataclasses.replace(release, metadata={**release.metadata, "harness": ref})
