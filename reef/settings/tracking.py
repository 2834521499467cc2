"""tracking: the MLflow tracking store and where its run artifacts go."""

from __future__ import annotations

from pydantic import Field, SecretStr

from reef.settings.section import Section


class TrackingSettings(Section):
    # Secret: a database tracking store's URI may carry a password (Settings.tracking_uri).
    uri: SecretStr | None = Field(
        None, description="MLflow tracking URI; default: sqlite:///<state_dir>/mlflow.db"
    )
    artifact_location: str | None = Field(
        None, description="where MLflow stores run artifacts; default: <artifacts url>/mlflow"
    )
