"""judge: who turns next turns and text-only reports into scored reports."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator

from reef.settings.section import DOTTED, Section


class JudgeSettings(Section):
    """judge: who turns next turns and text-only reports into scored reports (reef.judge), in the
    worker. Default judge: the scenario's served head through the engine's admin generate
    route; `url` + `model` name any OpenAI-compatible /v1 instead; `function` a rule judge."""

    enabled: bool | None = Field(
        None, description="judge in the worker; null: when the recipe is openclaw"
    )
    function: str | None = Field(
        None, description="pkg.module:fn(task, exchange, sample) -> the judge's raw answer"
    )
    url: str | None = Field(None, description="an OpenAI-compatible judge's base URL (/v1)")
    model: str | None = Field(None, description="the model name sent to `url`")
    api_key: SecretStr | None = Field(None, description="the key for `url` (REEF_JUDGE__API_KEY)")
    method: Literal["likelihood", "generate"] = Field(
        "likelihood",
        description="likelihood: the served base model reads the reaction once and the verdict "
        "is the likeliest label, calibrated by a probe (reef.verdicts; needs the model's files, "
        "so not in upstream mode); generate: m sampled answers per question ending in "
        "\\boxed{v} (judge.url and judge.function always generate)",
    )
    min_confidence: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="a verdict less sure than this is stored but scores 0 and trains nothing",
    )
    min_agreement: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="train on the judge's verdicts only while its agreement with people's "
        "scores on the same turns is shown at least this high: the lower end of the 90% "
        "Wilson interval over the last `agreement_window` compared turns (few compared turns "
        "show little, so they hold training back too); null: no such check",
    )
    agreement_window: int = Field(
        50, ge=1, description="the most recent turns, judged and scored by a person, it counts"
    )
    hints: Literal["reaction", "none"] = Field(
        "reaction",
        description="likelihood judges: the hint of a negative verdict on a user's reaction "
        "longer than 10 characters is the reaction itself (reaction), or there is none",
    )
    probe: bool = Field(
        True,
        description="likelihood judges: calibrate with a probe fitted on the shipped seed "
        "labels plus the scenario's turns that a person scored and that have a next state",
    )
    retries: int = Field(
        1,
        ge=0,
        description="a judging that fails or times out is tried again this often, then "
        "stored as a drop with its reason (scenario status, /metrics)",
    )
    votes: int = Field(3, ge=1, description="m: answers per question, plurality wins")
    temperature: float = Field(0.6, ge=0.0, description="generate: sampling temperature")
    max_tokens: int = Field(512, ge=1, description="generate: most tokens in one answer")
    timeout_s: float = Field(120.0, gt=0, description="per judged turn (all its answers)")
    concurrency: int = Field(8, ge=1, description="turns judged at once")
    session_ttl_s: float = Field(
        900.0, gt=0, description="a last turn with no next turn after this long is retired"
    )
    poll_s: float = Field(2.0, gt=0, description="how often the worker looks for new turns")

    @field_validator("function")
    @classmethod
    def _dotted(cls, v: str | None) -> str | None:
        if v is not None and not DOTTED.fullmatch(v):
            raise ValueError("judge.function must be a dotted path pkg.module:function")
        return v
