"""The discovery demo's own settings: the `discover:` section of the YAML file given with
`python -m demo.discover -c FILE` (Reef's server settings are separate; the demo starts the
server with its own)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reef.errors import ConfigError


class DiscoverSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    allow_weak_sandbox: bool = Field(
        False,
        description="run programs without the bubblewrap boundary where it cannot be made "
        "(audit hook and `unshare -n` only: native code gets around them; trusted programs "
        "only). Off: the demo refuses to start there.",
    )
    action: Literal["program", "edits", "api", "coords"] = Field(
        "program",
        description="what a rollout answers: `program` (a whole Python program, the paper's "
        "action; for models that write code), `edits` (a JSON list of edits to the parent's "
        "circles: place/grow/nudge; parsed strictly, never executed), `api` (a few calls to "
        "the place/grow/nudge helpers, run in the sandbox) or `coords` (the parent's circles "
        "rewritten). `--action` overrides it.",
    )
    constrained: bool = Field(
        False,
        description="ask the engine to enforce the action's JSON schema while it decodes "
        "(`response_format`; `edits` only): every answer is then a well-formed edit list in the "
        "random proposer's ranges (1-3 edits, moves within ±0.1, radii ≤ 0.25), and the "
        "exact verifier still judges the packing. `--constrained` overrides it.",
    )
    start: Literal["grid", "scattered"] = Field(
        "grid",
        description="the edit actions' seeded circles: `grid` (the baseline program's grid, "
        "each circle grown as far as it fits: tight, local edits seldom improve it) or "
        "`scattered` (fixed pseudo-random centres grown the same way: room to climb). "
        "`--start` overrides it.",
    )


def load(path: Path | None) -> DiscoverSettings:
    """The `discover:` section of `path` (defaults where there is no file or no section)."""
    if path is None:
        return DiscoverSettings()
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from None
    section = data.get("discover", {}) if isinstance(data, dict) else None
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: `discover` must be a mapping")
    try:
        return DiscoverSettings.model_validate(section)
    except ValidationError as e:
        raise ConfigError(f"{path}: invalid discover settings: {e}") from None
