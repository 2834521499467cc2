"""telemetry: OpenTelemetry traces exported over OTLP/HTTP (protobuf), off unless an endpoint
is set."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator

from reef.settings.section import Section

TRACES_PATH = "/v1/traces"


class TelemetrySettings(Section):
    """telemetry: OpenTelemetry traces exported over OTLP/HTTP (protobuf), off unless
    otlp_endpoint is set."""

    otlp_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP receiver (a collector, Jaeger, Tempo, Phoenix, Langfuse): its "
        "base URL (…:4318; /v1/traces is added) or the full traces URL; null: no telemetry, "
        "and the OpenTelemetry SDK is never imported",
    )
    # Secret: receivers such as Langfuse take an Authorization header.
    otlp_headers: SecretStr | None = Field(
        None, description="headers sent with every export, as 'k1=v1,k2=v2' (OTLP's format)"
    )
    service_name: str = Field("reef", description="the resource's service.name")
    queue_size: int = Field(
        4096, ge=1, description="spans waiting for export; a span beyond it is dropped (counted)"
    )
    batch_size: int = Field(512, ge=1, description="most spans in one export request")
    export_interval_s: float = Field(1.0, gt=0, description="longest wait before an export")
    export_timeout_s: float = Field(10.0, gt=0, description="one export request's timeout")

    @field_validator("otlp_endpoint")
    @classmethod
    def _http(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("must be an http:// or https:// URL")
        return v

    @property
    def traces_url(self) -> str | None:
        """Where spans are posted: the endpoint's /v1/traces unless it names a path already."""
        if self.otlp_endpoint is None:
            return None
        url = self.otlp_endpoint.rstrip("/")
        return url if urlsplit(url).path not in ("", "/") else url + TRACES_PATH

    def header_map(self) -> dict[str, str]:
        """`otlp_headers` as a mapping (an entry without '=' is ignored)."""
        if self.otlp_headers is None:
            return {}
        out = {}
        for item in self.otlp_headers.get_secret_value().split(","):
            key, sep, value = item.partition("=")
            if sep and key.strip():
                out[key.strip()] = value.strip()
        return out
