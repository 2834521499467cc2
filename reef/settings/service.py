"""Service settings: defaults < YAML file (`reef serve -c`) < REEF_* environment < CLI flags."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from reef.errors import ConfigError
from reef.settings.artifacts import ArtifactSettings
from reef.settings.auth import AuthSettings
from reef.settings.engine import FLAT_KEYS, EngineSettings, log_moved, nest_flat_keys
from reef.settings.events import EventSettings
from reef.settings.gate import GateSettings
from reef.settings.judge import JudgeSettings
from reef.settings.loop import LoopSettings
from reef.settings.metrics import Metrics, check_learning_metric
from reef.settings.prefect import PrefectSettings
from reef.settings.review import ReviewSettings
from reef.settings.rollout import RolloutSettings
from reef.settings.scenarios import ScenarioSettings, merged
from reef.settings.section import describe
from reef.settings.server import ServerSettings
from reef.settings.store import StoreSettings
from reef.settings.telemetry import TelemetrySettings
from reef.settings.tracking import TrackingSettings

log = logging.getLogger(__name__)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="REEF_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    server: ServerSettings = ServerSettings()
    engine: EngineSettings = EngineSettings()
    store: StoreSettings = StoreSettings()
    auth: AuthSettings = AuthSettings()
    reef: LoopSettings = LoopSettings()
    gate: GateSettings = GateSettings()
    artifacts: ArtifactSettings = ArtifactSettings()
    tracking: TrackingSettings = TrackingSettings()
    rollout: RolloutSettings = RolloutSettings()
    judge: JudgeSettings = JudgeSettings()
    review: ReviewSettings = ReviewSettings()
    prefect: PrefectSettings = PrefectSettings()
    telemetry: TelemetrySettings = TelemetrySettings()
    events: EventSettings = EventSettings()
    metrics: Metrics = Field(
        default_factory=dict,
        description="named metrics every scenario's reports may carry beside `score`: "
        "{name: {type: boolean|float|categorical, range, values}}",
    )
    scenarios: dict[str, ScenarioSettings] = Field(
        default_factory=dict,
        description="per-scenario settings (reef, gate, judge, review, metrics, "
        "engine.sampling_defaults) over the top-level ones",
    )

    @model_validator(mode="after")
    def _each_scenario(self) -> Settings:
        """Every scenario's merged settings validate at load, errors naming the scenario."""
        check_learning_metric(self.reef.metric, self.metrics)
        for name in self.scenarios:
            self.for_scenario(name)
        return self

    def for_scenario(self, name: str, runtime: Mapping[str, Any] | None = None) -> Settings:
        """These settings as scenario `name` learns and is served with them: its
        `scenarios.<name>` keys over the top-level reef, gate, judge and review sections (and
        its engine.sampling_defaults over the engine's), and over those `runtime` (the keys
        set at run time, PUT /reef/scenarios/{s}/settings). What the operator set stays set,
        so a recipe's own default gate still applies where no gate.policy was given."""
        override = self.scenarios.get(name)
        if runtime:
            base = override.model_dump() if override is not None else {}
            try:
                override = ScenarioSettings.model_validate(merged(base, dict(runtime)))
            except ValidationError as e:
                raise ValueError(f"scenarios.{name}: {describe(e)}") from None
        if override is None:
            return self
        update: dict[str, Any] = {}
        for section in ("reef", "gate", "judge", "review"):
            keys = getattr(override, section)
            if not keys:
                continue
            current = getattr(self, section)
            try:
                update[section] = type(current).model_validate(
                    merged(current.model_dump(exclude_unset=True), keys)
                )
            except ValidationError as e:
                raise ValueError(f"scenarios.{name}.{section}: {describe(e)}") from None
        sampling = override.engine.sampling_defaults
        if sampling is not None:  # how the engine samples this scenario's calls
            update["engine"] = self.engine.model_copy(update={"sampling_defaults": dict(sampling)})
        if override.metrics:  # the scenario's metrics beside (or instead of) the top-level ones
            update["metrics"] = {**self.metrics, **override.metrics}
        resolved = self.model_copy(update={**update, "scenarios": {}})
        try:
            check_learning_metric(resolved.reef.metric, resolved.metrics)
        except ValueError as e:
            raise ValueError(f"scenarios.{name}: {e}") from None
        # resolved: no per-scenario keys are left to apply (calling this again changes nothing)
        return resolved

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        env = _EnvSource(settings_cls, log_moves=False)
        return (init_settings, env, dotenv_settings, file_secret_settings)

    @property
    def artifacts_url(self) -> str:
        return self.artifacts.url or str(self.server.state_dir / "artifacts")

    @property
    def tracking_uri(self) -> str:
        if self.tracking.uri:
            return self.tracking.uri.get_secret_value()
        return f"sqlite:///{(self.server.state_dir / 'mlflow.db').resolve()}"

    @property
    def prefect_ui_url(self) -> str | None:
        """The Prefect UI's address, for links to flow runs: `prefect.ui_url`, else Prefect's
        own PREFECT_UI_URL, else PREFECT_API_URL when it is a server's `.../api` (the UI is
        served beside it, as `prefect server start` does); None when none says where."""
        explicit = self.prefect.ui_url or os.environ.get("PREFECT_UI_URL") or ""
        if explicit.startswith(("http://", "https://")):  # never a javascript: link
            return explicit.rstrip("/")
        api = (os.environ.get("PREFECT_API_URL") or "").rstrip("/")
        if api.startswith(("http://", "https://")) and api.endswith("/api"):
            return api.removesuffix("/api")
        return None

    @property
    def mlflow_artifact_location(self) -> str:
        if self.tracking.artifact_location:
            return self.tracking.artifact_location
        base = self.artifacts_url
        if "://" in base:
            return base.rstrip("/") + "/mlflow"
        return (Path(base) / "mlflow").resolve().as_uri()

    @property
    def default_max_tokens(self) -> int:
        """engine.default_max_tokens, held to server.max_tokens_cap."""
        return min(self.engine.default_max_tokens, self.server.max_tokens_cap)

    @property
    def server_url(self) -> str:
        """This server's root URL, as a client on its host reaches it."""
        host = "127.0.0.1" if self.server.host in ("0.0.0.0", "::") else self.server.host
        return f"http://{host}:{self.server.port}"

    @property
    def engine_url(self) -> str:
        if self.reef.engine_url:
            return self.reef.engine_url.rstrip("/")
        return self.server_url

    @property
    def engine_advertise_url(self) -> str:
        """The admin URL this server registers (engine.fleet.registry)."""
        return self.engine.fleet.advertise_url or self.server_url

    @property
    def database_url(self) -> str:
        if self.store.database_url:
            return self.store.database_url.get_secret_value()
        return f"sqlite:///{self.server.state_dir / 'reef.db'}"


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


class _EnvSource(EnvSettingsSource):
    """REEF_* variables, the engine's flat names (REEF_ENGINE__VLLM_URL) read as their nested
    ones (REEF_ENGINE__VLLM__URL) before the names are split, so that their values parse as the
    nested keys' types (a JSON list for REEF_ENGINE__VLLM_ARGS). `log_moves`: say so in the
    log (once per load: load_settings reads the environment twice)."""

    def __init__(self, settings_cls: type[BaseSettings], *, log_moves: bool) -> None:
        self.log_moves = log_moves
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        env = dict(super()._load_env_vars())  # names in lower case: the settings ignore case
        for name in [n for n in env if n.startswith("reef_engine__")]:
            old = name.removeprefix("reef_engine__")
            if old not in FLAT_KEYS:
                continue
            new = "__".join(("reef_engine", *FLAT_KEYS[old]))
            if new in env:
                raise ConfigError(f"{name.upper()} and {new.upper()} are the same setting: set one")
            env[new] = env.pop(name)
            if self.log_moves:
                log.warning("settings: %s is deprecated, read as %s", name.upper(), new.upper())
        return env


def _nested(data: dict[str, Any], where: str) -> dict[str, Any]:
    """`data` (a layer of settings: a file, the flags) with the engine's flat keys in their
    sections, each move logged once."""
    engine = data.get("engine")
    if not isinstance(engine, dict):
        return data
    try:
        engine, moved = nest_flat_keys(engine)
    except ValueError as e:
        raise ConfigError(f"invalid settings{where}: {e}") from None
    log_moved(moved, where)
    return {**data, "engine": engine}


def load_settings(config: Path | str | None = None, **overrides: Any) -> Settings:
    """Build the settings once at start. `overrides` are CLI flags as nested dicts."""
    where = f" in {config}" if config else ""
    # Each layer is nested on its own, so that a flat key in one layer and its nested place in
    # another keep the layers' order.
    file_data = _nested(_read_yaml(Path(config)), where) if config else {}
    overrides = _nested(overrides, "")

    class _Layered(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            env = _EnvSource(settings_cls, log_moves=True)
            return (init_settings, env, InitSettingsSource(settings_cls, file_data))

    try:
        layered = _Layered(**overrides)
        # Only what was given (flags, env, file): the rest fills in from the defaults, so each
        # section's `model_fields_set` says what the operator chose (a recipe's default gate
        # applies only when no `gate.policy` was given).
        settings = Settings.model_validate(layered.model_dump(exclude_unset=True))
    except ValidationError as e:
        raise ConfigError(f"invalid settings{where}: {describe(e)}") from None
    if not settings.server.is_loopback and not settings.auth.tokens:
        raise ConfigError(
            f"binding {settings.server.host} (not loopback) requires auth tokens: "
            "add auth.tokens to the config (`reef token` makes one)"
        )
    if settings.engine.kind == "upstream" and not settings.engine.upstream.url:
        raise ConfigError("engine.kind 'upstream' needs engine.upstream.url (--upstream-url)")
    return settings
