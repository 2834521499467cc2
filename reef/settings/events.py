"""events: webhooks told when a candidate, a release or a rollout changes, signed and retried
(reef.events)."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from reef.settings.section import Section

# Every kind of event a webhook can subscribe to (reef.events says when each is sent).
EVENT_KINDS = (
    "candidate.rejected",
    "candidate.pending_approval",
    "release.published",
    "guard.failed",
    "rollout.promoted",
    "rollout.rolled_back",
    "evolve.failed",
)


class WebhookSettings(Section):
    """events.webhooks[]: one receiver of events."""

    url: str = Field(description="where events are POSTed (http:// or https://)")
    events: tuple[str, ...] = Field(
        EVENT_KINDS, description="the kinds of event sent there (default: every kind)"
    )
    secret: SecretStr = Field(
        description="signs each body: x-reef-signature: sha256=<HMAC-SHA256 of the body, hex>"
    )

    @field_validator("url")
    @classmethod
    def _http(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("must be an http:// or https:// URL")
        return v

    @field_validator("events")
    @classmethod
    def _known(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(v) - set(EVENT_KINDS))
        if unknown:
            raise ValueError(f"unknown event kinds {unknown}: use some of {list(EVENT_KINDS)}")
        return v

    @field_validator("secret")
    @classmethod
    def _long_enough(cls, v: SecretStr) -> SecretStr:
        if len(v.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters")
        return v


class EventSettings(Section):
    """events: webhooks told when a candidate, a release or a rollout changes, signed and
    retried (reef.events)."""

    webhooks: tuple[WebhookSettings, ...] = Field(
        (), description="[{url, events, secret}]: where events are sent; none: no event is kept"
    )
    poll_s: float = Field(2.0, gt=0, description="how often the deliverer looks for due events")
    timeout_s: float = Field(10.0, gt=0, description="one delivery's HTTP timeout")
    backoff_s: float = Field(
        1.0, gt=0, description="wait after a first failed delivery; doubled after each failure"
    )
    backoff_max_s: float = Field(600.0, gt=0, description="the longest wait between tries")
    max_attempts: int = Field(
        20, ge=1, description="tries before a delivery is given up (shown as failed)"
    )
    keep_days: float = Field(
        7.0, gt=0, description="delivered and given-up events are deleted after this long"
    )

    @model_validator(mode="after")
    def _one_per_url(self) -> EventSettings:
        urls = [w.url for w in self.webhooks]
        if len(urls) != len(set(urls)):
            raise ValueError("each webhook url may appear once (merge their events)")
        return self

    def secret_for(self, url: str) -> str | None:
        """The signing secret of the webhook at `url`; None when none is configured there."""
        for hook in self.webhooks:
            if hook.url == url:
                return hook.secret.get_secret_value()
        return None
