"""A candidate's provenance: what made it, passed whole from the flow to the registry."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Provenance:
    """Where a candidate came from, as the flow that made it knows it. Registering writes it
    to the MLflow model version (tags, reef_release.json), the candidates row (recipe, dataset,
    metrics) and the release's metadata (`metadata`)."""

    recipe: str
    dataset_id: str | None = None  # the training snapshot's content hash
    metrics: Mapping[str, float] = field(default_factory=dict)
    run_id: str | None = None  # the MLflow run it is logged under (None: a run of its own)
    # what an adapter is loaded onto: a model directory or a spec ("tiny"); None: the one its
    # adapter_config.json names
    base_model: str | Path | None = None
    # joins its release's metadata: the recipe's own (Trained.metadata), the Prefect flow run
    metadata: Mapping[str, Any] = field(default_factory=dict)
    # more `reef.<key>` tags of its MLflow model version (a composite release names its parts)
    tags: Mapping[str, str] = field(default_factory=dict)

    def with_metadata(self, more: Mapping[str, Any]) -> Provenance:
        """The same provenance with `more` joining its metadata."""
        return replace(self, metadata={**self.metadata, **more}) if more else self
