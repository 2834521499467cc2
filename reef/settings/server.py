"""server: where Reef listens, the request limits it enforces, and who may scrape /metrics."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator

from reef.settings.section import Section

_HOST_NAME = re.compile(r"(\*\.)?[a-z0-9_-]+(\.[a-z0-9_-]+)*\.?")


def host_name(text: str) -> str:
    """A host name as a Host header carries it, without a port: lower case, IPv6 addresses in
    brackets; `*` (any host) and `*.example.com` (its subdomains) pass as they are."""
    name = text.strip().lower()
    if name == "*":
        return name
    bare = name.removeprefix("[").removesuffix("]")
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        pass
    else:
        return f"[{address}]" if address.version == 6 else str(address)
    if not _HOST_NAME.fullmatch(name):
        raise ValueError(f"'{text}' is not a host name (give names without scheme or port)")
    return name.rstrip(".")


class ServerSettings(Section):
    """server: where Reef listens, where it keeps local state, the request limits it enforces
    (a request over one gets 400 or 413) and who may scrape /metrics."""

    host: str = Field(
        "127.0.0.1",
        description="bind address; one that is not loopback requires auth.tokens",
    )
    port: int = Field(8900, ge=0, le=65535, description="TCP port the API listens on")
    state_dir: Path = Field(
        Path(".reef"),
        description="local state: the SQLite database, artifacts and MLflow store by default",
    )
    default_scenario: str = Field(
        "default",
        description="the scenario of a request that names none (x-reef-scenario header)",
    )
    max_body_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="request body size cap; a larger body gets 413"
    )
    max_import_bytes: int = Field(
        1024 * 1024 * 1024,
        ge=1024,
        description="cap on a records:import body (JSONL, spooled to a temporary file while it "
        "arrives); a larger one gets 413",
    )
    max_tokens_cap: int = Field(4096, ge=1, description="largest max_tokens a request may ask")
    max_n: int = Field(4, ge=1, description="largest n (choices per request) a request may ask")
    max_stop: int = Field(4, ge=0, description="most stop strings (stop, stop_sequences)")
    max_stop_chars: int = Field(256, ge=1, description="longest stop string, in characters")
    max_messages: int = Field(1024, ge=1, description="most messages in one request")
    max_tools: int = Field(128, ge=0, description="most tool definitions in one request")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="least severe log line written (Reef's and uvicorn's)"
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="text lines, or JSON lines (time, level, logger, message, scenario, "
        "record_id, request_id): Reef's, uvicorn's and the evolve worker's alike",
    )
    allowed_hosts: tuple[str, ...] = Field(
        (),
        description="Host header names answered besides loopback (and the bound host), any "
        "port; '*.example.com' for subdomains, '*' for any; others get 421",
    )
    metrics_token: SecretStr | None = Field(
        None, description="/metrics answers only `Authorization: Bearer <this>` when set"
    )
    metrics_scenario_labels: bool | None = Field(
        None,
        description="label /metrics series by scenario (names are visible to whoever scrapes); "
        "null: only when metrics_token is set",
    )

    @field_validator("state_dir")
    @classmethod
    def _expand_state_dir(cls, v: Path) -> Path:
        return v.expanduser()

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(host_name(h) for h in v)

    @property
    def scenario_labels(self) -> bool:
        """Whether /metrics names scenarios (see metrics_scenario_labels)."""
        if self.metrics_scenario_labels is None:
            return self.metrics_token is not None
        return self.metrics_scenario_labels

    @property
    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False
