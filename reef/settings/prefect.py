"""prefect: the Prefect UI the dashboard links flow runs to."""

from __future__ import annotations

from pydantic import Field, field_validator

from reef.settings.section import Section


class PrefectSettings(Section):
    """prefect: the Prefect UI the dashboard links flow runs to."""

    ui_url: str | None = Field(
        None,
        description="the Prefect UI the dashboard links flow runs to; default: PREFECT_UI_URL, "
        "else PREFECT_API_URL without its /api suffix",
    )

    @field_validator("ui_url")
    @classmethod
    def _http(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// address")
        return v
