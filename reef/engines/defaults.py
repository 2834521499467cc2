"""A model's recommended sampling values, applied to requests that leave them out.

SmolLM2's model card recommends temperature 0.2 and top_p 0.9; at OpenAI's default temperature
1.0 its answers are often gibberish. vLLM applies a model's generation_config.json to requests
that name no sampling parameters (`--generation-config auto`, its default); the embedded engine
does the same, and the upstream engines can be given values to fill in (engine.sampling_defaults).
No torch here: the upstream engines import it too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# The sampling parameters a model's generation_config.json may recommend. A request that names
# none of them gets all the model's values; one that names any is taken as it is (vLLM fills
# each missing one on its own instead): a recipe that picks a temperature keeps the distribution
# it asked for, not one cut by a top_p recommended for chat.
DEFAULTABLE = ("temperature", "top_p")


def generation_defaults(model_dir: Path) -> dict[str, float]:
    """The sampling values `model_dir`'s generation_config.json recommends (the keys of
    DEFAULTABLE it names), as vLLM's `--generation-config auto` reads them; {} when it has none."""
    path = Path(model_dir) / "generation_config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(config, dict):
        return {}
    return {
        key: float(config[key])
        for key in DEFAULTABLE
        if isinstance(config.get(key), (int, float)) and not isinstance(config.get(key), bool)
    }


def with_defaults(
    body: dict[str, Any], defaults: dict[str, float]
) -> tuple[dict[str, Any], list[str]]:
    """`body` with `defaults` filled in when it names no sampling parameter (absent or null
    counts as not named), and the keys filled. A shallow copy when anything is filled: the
    caller's body stays what the client sent."""
    if any(body.get(k) is not None for k in DEFAULTABLE):
        return body, []
    filled = [k for k in DEFAULTABLE if k in defaults]
    if not filled:
        return body, []
    return {**body, **{k: defaults[k] for k in filled}}, filled


def sampling_record(body: dict[str, Any], filled: list[str]) -> dict[str, Any]:
    """What a record keeps of how its answer was sampled (Completion.sampling): the values of
    DEFAULTABLE the engine used (None: left to the engine's own default) and which of them
    came from the model's defaults rather than the request."""
    used = {k: body.get(k) for k in DEFAULTABLE}
    return {**used, "defaults": filled}


def sampling_tags(sampling: dict[str, Any] | None) -> dict[str, str]:
    """A record's tags for Completion.sampling, beside the other `reef.*` tags the server sets:
    `reef.temperature` and `reef.top_p` for the values the engine used (none for a value left
    to an upstream's own default), and `reef.sampling_defaults` naming those that came from
    the model's defaults rather than the request."""
    if not sampling:
        return {}
    tags = {f"reef.{k}": str(sampling[k]) for k in DEFAULTABLE if sampling.get(k) is not None}
    if sampling.get("defaults"):
        tags["reef.sampling_defaults"] = ",".join(sampling["defaults"])
    return tags
