"""Which engine variant serves a release: its files fetched from the artifact store, loaded
into the engine under `<scenario>@<release_id>`, verified, and unloaded once outside the keep
window.

A base release is served by the engine's own model. Any other release is a variant: a LoRA
adapter or a full checkpoint. Variants are loaded ahead of time by a deploy (the admin routes
call `load`, then `verify`, before the head moves) or, when a process starts with a trained
head or another process moved it, on the first call that needs one. A release is immutable, so
its variant name never changes meaning: nothing is ever reloaded in place under a name.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path
from typing import Any, cast

from reef.artifacts import ArtifactStore
from reef.engines.base import Deployable, Engine
from reef.errors import BadRequest, EngineError, Forbidden, NotFound
from reef.records import Release
from reef.rollouts import served_release
from reef.store.base import Store
from reef.store.deadline import bounded
from reef.wire import SCENARIO_PATTERN

log = logging.getLogger(__name__)


def variant_name(scenario: str, release_id: str) -> str:
    return f"{scenario}@{release_id}"


_SCENARIO = re.compile(SCENARIO_PATTERN)


class Variants:
    """The releases an engine holds, by release id; one load at a time per release."""

    def __init__(
        self,
        engine: Engine,
        store: Store,
        artifacts: ArtifactStore,
        cache_dir: Path,
        *,
        store_deadline_s: float | None = None,
    ):
        self.engine = engine
        self.store = store
        # A call's release lookup waits this long at most (store.deadline_s; reef.store.deadline)
        self.store_deadline_s = store_deadline_s
        self.artifacts = artifacts
        self.cache_dir = cache_dir
        self._releases: dict[str, Release] = {}  # release id -> release (immutable: cached)
        self._locks: dict[str, asyncio.Lock] = {}
        self._deployable = isinstance(engine, Deployable)  # a Protocol check: not per request

    @property
    def deployable(self) -> bool:
        return self._deployable

    def loaded(self) -> list[str]:
        """The variants the engine holds. The engine is the truth: a long-running one (vLLM)
        can hold releases an earlier Reef process loaded (a release's name never changes
        meaning), and full weights leave it when newer full weights replace them."""
        if not self._deployable:
            return []
        return sorted(cast(Deployable, self.engine).variants())

    async def release(self, scenario: str, release_id: str) -> Release:
        hit = self._releases.get(release_id)
        if hit is None:
            # A live canary serves before it is on the chain (reef.rollouts), with the files
            # it keeps once published: cached under its id as a release is.
            hit = await bounded(
                self.store_deadline_s, served_release, self.store, scenario, release_id
            )
            self._releases[release_id] = hit
        return hit

    async def model_for(self, scenario: str, release_id: str) -> str | None:
        """The engine model name that serves `release_id` (None: the engine's base model),
        loading the release first when this engine does not hold it yet."""
        release = await self.release(scenario, release_id)
        if release.kind == "base":
            return None
        name = variant_name(scenario, release.weights_id)
        if name not in self.loaded():
            if not release.uri:
                raise NotFound(f"release {release_id} has no files to load")
            await self.load(name, release.kind, release.uri)
        return name

    async def catch_up(self) -> list[str]:
        """Load every scenario's head release: a process that starts after a deploy (a replica
        that was down during it, or a new one) holds what it serves before the first call
        asks. Best effort, in order: what fails is logged, and a call loads its head itself."""
        if not self._deployable:
            return []
        loaded = []
        for scenario in await asyncio.to_thread(self.store.list_scenarios):
            try:
                name = await self.model_for(scenario.name, scenario.head_release_id)
            except Exception as e:  # the first call that needs it tries again (and says why)
                log.warning("loading the head of %s on start failed: %s", scenario.name, e)
                continue
            if name is not None:
                loaded.append(name)
        if loaded:
            log.info("loaded the heads this engine serves: %s", ", ".join(loaded))
        return loaded

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def load(self, name: str, kind: str, source: str) -> dict[str, Any]:
        """Load `source` (a local directory or an artifact-store uri) as variant `name`;
        a name already loaded is left as it is (never reloaded in place)."""
        async with self._lock(name):
            engine = self.engine
            if not isinstance(engine, Deployable):
                raise EngineError(
                    f"the {engine.kind} engine cannot serve trained releases ({name} is a {kind})",
                    code="not_deployable",
                )
            if name in engine.variants():
                return {"name": name, "loaded": False}
            started = time.monotonic()
            local = await asyncio.to_thread(self._local, source)
            if kind == "adapter":
                await engine.load_adapter(name, local)
            elif kind == "checkpoint":
                await engine.load_weights(name, local)
            else:
                raise BadRequest(f"{name}: the engine cannot load a {kind}")
            seconds = time.monotonic() - started
            log.info("loaded %s (%s) in %.2f s", name, kind, seconds)
            return {"name": name, "loaded": True, "seconds": round(seconds, 3)}

    def check_source(self, name: str, source: str) -> None:
        """Refuse (403) to load `source` as variant `name` unless it is release files of the
        variant's own scenario in the artifact store: `name` is `<scenario>@<release_id>` (a
        scenario name holds no '@'), and `source` lies under `<artifacts>/releases/<scenario>/`,
        where registering a candidate puts its files (deploy.candidates). What an admin route is
        asked to load; a deploy asks exactly that. Any local directory: engine.allow_local_paths.
        """
        scenario, at, release_id = name.partition("@")
        if not at or not release_id or not _SCENARIO.fullmatch(scenario):
            raise Forbidden(
                f"variant name '{name}' is not <scenario>@<release_id>: only a scenario's "
                "release files can be loaded (engine.allow_local_paths lifts this)",
                code="source_not_allowed",
            )
        prefix = f"{self.artifacts.uri('').rstrip('/')}/releases/{scenario}/"
        parts = source.removeprefix(prefix).rstrip("/").split("/")
        if not source.startswith(prefix) or any(p in ("", ".", "..") for p in parts):
            raise Forbidden(
                f"'{name}' may load only release files of scenario '{scenario}' from the "
                f"artifact store ({prefix}...), not '{source}' (engine.allow_local_paths lifts "
                "this)",
                code="source_not_allowed",
            )

    def local_files(self, source: str) -> Path:
        """The release files at `source` as a local directory (blocking: call in a thread)."""
        return self._local(source)

    def _local(self, source: str) -> Path:
        """A local directory for `source`: fetched from the artifact store when it lives there."""
        root = self.artifacts.uri("").rstrip("/") + "/"
        if source.startswith(root):
            key = source[len(root) :].strip("/")
            return self.artifacts.fetch_tree(key, self.cache_dir / key)
        path = Path(source.removeprefix("file://"))
        if "://" in source and not source.startswith("file://"):
            raise BadRequest(f"'{source}' is neither a local directory nor in {root}")
        if not path.is_dir():
            raise BadRequest(f"'{source}' is not a directory")
        return path

    async def verify(self, name: str) -> dict[str, Any]:
        """A smoke generation on a loaded variant."""
        engine = self.engine
        if name not in self.loaded() or not isinstance(engine, Deployable):
            raise NotFound(f"no variant '{name}' is loaded")
        return {"name": name, "verified": True, **await engine.verify(name)}

    async def unload(self, name: str) -> bool:
        async with self._lock(name):
            if name not in self.loaded():
                return False
            engine = self.engine
            assert isinstance(engine, Deployable)
            await engine.unload(name)
            return True
