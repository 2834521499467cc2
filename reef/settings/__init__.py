"""Service settings: defaults < YAML file (`reef serve -c`) < REEF_* environment < CLI flags.

One module per section (server, engine, store, ...); `service` holds the whole and its
loading, `secret` how secret settings travel. Everything public is importable from here."""

from reef.settings.artifacts import ArtifactSettings
from reef.settings.auth import AuthSettings, QuotaSettings, TokenSettings
from reef.settings.engine import (
    EmbeddedSettings,
    EngineSettings,
    FleetSettings,
    UpstreamSettings,
    VllmSettings,
)
from reef.settings.events import EVENT_KINDS, EventSettings, WebhookSettings
from reef.settings.gate import GateSettings, GuardSettings
from reef.settings.judge import JudgeSettings
from reef.settings.loop import LoopSettings, TrainSettings
from reef.settings.prefect import PrefectSettings
from reef.settings.review import ReviewSettings
from reef.settings.rollout import ABSettings, RolloutSettings, ShadowSettings
from reef.settings.scenarios import ScenarioSettings
from reef.settings.secret import (
    conceal,
    secret_environment,
    secret_keys,
    secret_names,
    split_secrets,
)
from reef.settings.server import ServerSettings, host_name
from reef.settings.service import Settings, load_settings
from reef.settings.store import StoreSettings
from reef.settings.telemetry import TelemetrySettings
from reef.settings.tracking import TrackingSettings

__all__ = [
    "EVENT_KINDS",
    "ABSettings",
    "ArtifactSettings",
    "AuthSettings",
    "EmbeddedSettings",
    "EngineSettings",
    "EventSettings",
    "FleetSettings",
    "GateSettings",
    "GuardSettings",
    "JudgeSettings",
    "LoopSettings",
    "PrefectSettings",
    "QuotaSettings",
    "ReviewSettings",
    "RolloutSettings",
    "ScenarioSettings",
    "ServerSettings",
    "Settings",
    "ShadowSettings",
    "StoreSettings",
    "TelemetrySettings",
    "TokenSettings",
    "TrackingSettings",
    "TrainSettings",
    "UpstreamSettings",
    "VllmSettings",
    "WebhookSettings",
    "conceal",
    "host_name",
    "load_settings",
    "secret_environment",
    "secret_keys",
    "secret_names",
    "split_secrets",
]
