"""Deploy a release: stage it in the engine, verify it, then move the head by compare-and-swap.

The head is what a scenario serves, so it moves only after the engine holds the release and a
smoke generation on it succeeded. If loading or verifying fails (a ReefError, or anything else:
torch, the OS), or another publisher moved the head first (HeadMoved, 409), the staged variant
is unloaded and the head stays where it was. Once the head has moved, the rest (refreshing the
scenario, the MLflow mirror, unloading variants outside the keep window) can be redone, so a
failure there is logged and never fails the deploy.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from deploy.engine import EngineTarget
from reef.errors import ReefError
from reef.harness import harness_of
from reef.records import Release
from reef.store.base import Store
from reef.variants import variant_name

log = logging.getLogger(__name__)


def deploy(
    store: Store,
    engine: EngineTarget,
    release: Release,
    *,
    keep: int = 2,
    mirror: Callable[[Release], Any] | None = None,
) -> tuple[Release, dict[str, Any]]:
    """Stage, verify, publish (CAS on `release.parent_id`), mirror, retire; returns the stored
    release and the timings. `keep`: how many newest releases of the chain stay loaded."""
    timings: dict[str, Any] = {}
    release = _keep_harness(store, release)
    name = variant_name(release.scenario, release.weights_id)
    started = time.monotonic()
    # Whether this deploy loaded the variant, and so must unload it on failure. A release that
    # changed only the harness serves weights the engine may hold (and serve) already.
    staged = False
    try:
        if release.kind != "base":
            if not release.uri:
                raise ReefError(f"release {release.id} has no files to deploy")
            held = name in engine.variants()
            staged = not held
            loaded = engine.load(name, release.kind, release.uri)
            staged = not held and loaded.get("loaded", True) is not False
            timings["load_s"] = round(time.monotonic() - started, 3)
            timings["verify"] = engine.verify(name)
        published = store.publish_release(release)
    except BaseException:  # any failure before the head moved (torch, OS, a kill) unstages
        if staged:
            _unstage(engine, name)
        raise
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


def retire(store: Store, engine: EngineTarget, scenario: str, keep: int) -> list[str]:
    """Unload the scenario's variants that are not among its `keep` newest releases."""
    chain = store.list_releases(scenario)
    wanted = {variant_name(scenario, r.weights_id) for r in chain[-max(keep, 1) :]}
    gone = []
    for name in engine.variants():
        if name.startswith(f"{scenario}@") and name not in wanted:
            try:
                engine.unload(name)
                gone.append(name)
            except Exception as e:
                log.warning("unloading %s failed: %s", name, e)
    return gone


def _keep_harness(store: Store, release: Release) -> Release:
    """Weights trained on top of a head with a harness keep serving that harness."""
    if release.operation not in ("training", "promote") or harness_of(release) is not None:
        return release
    if release.parent_id is None:
        return release
    ref = harness_of(store.get_release(release.scenario, release.parent_id))
    if ref is None:
        return release
    return dataclasses.replace(release, metadata={**release.metadata, "harness": ref})


def _unstage(engine: EngineTarget, name: str) -> None:
    try:
        engine.unload(name)
    except Exception as e:
        log.warning("unloading staged %s failed: %s", name, e)
