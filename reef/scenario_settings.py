"""A scenario's learning settings as they apply now: the configuration's top-level reef, gate
and judge sections, its `scenarios.<name>` keys, and over both the newest version set at run
time (PUT /reef/scenarios/{s}/settings, stored append-only in the database so every replica
and the worker read the same)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from reef.errors import BadRequest, NotFound
from reef.records import SettingsVersion
from reef.store.scenarios import ScenarioStore

if TYPE_CHECKING:
    from reef.settings import Settings

log = logging.getLogger(__name__)


def current(store: ScenarioStore, scenario: str) -> SettingsVersion | None:
    """The newest run-time version of the scenario's settings; None when none was set (or
    the scenario does not exist yet)."""
    try:
        versions = store.scenario_settings(scenario, limit=1)
    except NotFound:
        return None
    return versions[0] if versions else None


def learning_settings(settings: Settings, store: ScenarioStore, scenario: str) -> Settings:
    """`settings` as `scenario` learns with them now (configuration, then run-time keys)."""
    version = current(store, scenario)
    return settings.for_scenario(scenario, version.settings if version else None)


def sampling_defaults(
    settings: Settings, store: ScenarioStore, scenario: str
) -> dict[str, float] | None:
    """The sampling values the engine gives `scenario`'s calls that name none, where the
    scenario has its own (`scenarios.<name>.engine.sampling_defaults`, then the run-time
    keys); None where they are the engine's (engine.sampling_defaults, or the model's).

    Serving reads this with the scenario's row, cached for the same few seconds. Run-time keys
    that no longer validate over a changed configuration do not stop serving: the
    configuration's value applies, with a warning."""
    version = current(store, scenario)
    runtime = version.settings if version else None
    conf = settings.scenarios.get(scenario)
    if not (runtime and runtime.get("engine")) and (
        conf is None or conf.engine.sampling_defaults is None
    ):
        return None  # nothing of the scenario's own: the common case, no validation
    try:
        own = settings.for_scenario(scenario, runtime).engine.sampling_defaults
    except ValueError as e:
        log.warning("scenario %s: run-time settings ignored for sampling: %s", scenario, e)
        own = settings.for_scenario(scenario).engine.sampling_defaults
    return None if own == settings.engine.sampling_defaults else own


def change(
    settings: Settings,
    store: ScenarioStore,
    scenario: str,
    keys: dict[str, Any],
    changed_by: str,
    expected_version: int | None = None,
) -> SettingsVersion:
    """Store `keys` ({reef, gate, judge, review, metrics, engine}: the whole run-time override,
    replacing the previous version's) as the scenario's next version, once they validate over
    the configuration (BadRequest naming the key otherwise). `expected_version`: the version
    the caller read (Conflict when another change came since); None: whatever is current."""
    try:
        settings.for_scenario(scenario, keys)
    except ValueError as e:
        raise BadRequest(str(e), code="invalid_settings", param="settings") from None
    now = current(store, scenario)
    if expected_version is None:
        expected_version = now.version if now else 0
    return store.set_scenario_settings(scenario, keys, changed_by, expected_version)
