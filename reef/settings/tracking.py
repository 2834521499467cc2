"""tracking: the MLflow tracking store and where its run artifacts go."""

from __future__ import annotations

from pydantic import Field, SecretStr

from reef.settings.section import Section


class TrackingSettings(Section):
    """tracking: the MLflow tracking store and where its run artifacts go."""

    # Secret: a database tracking store's URI may carry a password (Settings.tracking_uri).
    uri: SecretStr | None = Field(
        None, description="MLflow tracking URI; default: sqlite:///<state_dir>/mlflow.db"
    )
    artifact_location: str | None = Field(
        None, description="where MLflow stores run artifacts; default: <artifacts url>/mlflow"
    )
    # The serving process's own MLflow calls (a scenario's clean-up, a rollback's alias, a
    # harness release's model version): MLflow's defaults retry 7 times, up to 120 s each.
    http_timeout_s: int = Field(
        10,
        ge=1,
        description="the serving process's MLflow HTTP timeout per request (s); "
        "MLFLOW_HTTP_REQUEST_TIMEOUT in its environment wins; the evolve worker keeps MLflow's "
        "defaults",
    )
    http_retries: int = Field(
        2,
        ge=0,
        le=10,
        description="the serving process's MLflow HTTP retries per request; "
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES in its environment wins",
    )
