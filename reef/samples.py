"""Experience samples: the kinds a recipe can take and one frozen dataclass per kind."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from reef.errors import BadRequest

Kind = Literal["scored", "preference", "rollout", "trajectory"]
KINDS: tuple[Kind, ...] = ("scored", "preference", "rollout", "trajectory")


def check_kind(kind: str) -> Kind:
    if kind not in KINDS:
        raise BadRequest(f"unknown experience kind '{kind}': use one of {', '.join(KINDS)}")
    return kind


@dataclass(frozen=True)
class Turn:
    """One exchange of a trajectory, with the tokens the engine saw and produced."""

    record_id: str
    turn: int | None
    release_id: str
    messages: tuple[dict[str, Any], ...]
    completion: str
    prompt_token_ids: tuple[int, ...] | None
    completion_token_ids: tuple[int, ...] | None
    logprobs: tuple[float, ...] | None


@dataclass(frozen=True)
class ScoredSample:
    """A prompt, the answer given, and the score a report gave it (SFT, KTO)."""

    sample_id: str
    record_ids: tuple[str, ...]
    release_id: str
    staleness: int
    messages: tuple[dict[str, Any], ...]
    completion: str
    score: float
    report_id: str
    report_ids: tuple[str, ...]
    n_tokens: int | None
    # The counting report's feedback as canonical JSON text (a structured object may carry a
    # corrected answer under "correction", which SFT trains on instead of the completion).
    feedback: str | None = None


@dataclass(frozen=True)
class PreferenceSample:
    """Two answers to the same prompt with different scores (DPO)."""

    sample_id: str
    record_ids: tuple[str, ...]  # (chosen, rejected)
    release_id: str  # the chosen answer's
    staleness: int  # the older of the two
    messages: tuple[dict[str, Any], ...]
    chosen: str
    rejected: str
    chosen_score: float
    rejected_score: float
    report_ids: tuple[str, ...]
    n_tokens: int | None


@dataclass(frozen=True)
class RolloutSample:
    """A scored rollout with the exact tokens and the sampling log-probs (GRPO, PPO).

    A multi-turn rollout is flattened: `prompt_token_ids` is the first turn's prompt, the
    completion is everything after it; `completion_mask` is 1 on tokens the model generated and
    0 on tokens the environment inserted (later user/tool turns), whose log-probs read 0.0.
    """

    sample_id: str
    record_ids: tuple[str, ...]
    release_id: str
    staleness: int
    messages: tuple[dict[str, Any], ...]
    completion: str
    score: float
    report_id: str
    report_ids: tuple[str, ...]
    prompt_token_ids: tuple[int, ...]
    completion_token_ids: tuple[int, ...]
    completion_mask: tuple[int, ...]
    logprobs: tuple[float, ...] | None
    n_tokens: int
    # The counting report's metadata as canonical JSON text (null when it has none) and when it
    # was stored (ISO 8601): a recipe that addresses rollouts by metadata (tttd's step grid)
    # reads where each one sits and which report came first.
    report_metadata: str | None = None
    reported_at: str | None = None
    # The engine's generation-time top-K ids per completion token (Record.topk; an empty row on
    # inserted tokens), None when a turn has no capture: the openclaw recipe's student set.
    topk_ids: tuple[tuple[int, ...], ...] | None = None


@dataclass(frozen=True)
class TrajectorySample:
    """A session's turns, each with its messages, tokens and release, and the report's score."""

    sample_id: str
    record_ids: tuple[str, ...]
    release_id: str  # the last turn's
    staleness: int  # of the oldest turn
    session_id: str | None
    turns: tuple[Turn, ...]
    score: float
    report_id: str
    report_ids: tuple[str, ...]
    n_tokens: int | None


Sample = ScoredSample | PreferenceSample | RolloutSample | TrajectorySample
