"""The MLflow model registry as a mirror of each scenario's release chain.

One registered model per scenario, one model version per release, the alias ``champion`` on the
chain's head and tags a human can read and set in the MLflow UI. MLflow has no compare-and-swap,
so the chain itself lives in Reef's database; this package only mirrors it. Modules:

- `names`: registered model names, tag keys, status values, file names;
- `clients`: an `MlflowClient` per tracking URI, experiments, the S3 endpoint;
- `registration`: logging and registering a candidate or the base release;
- `versions`: finding versions, their tags and the champion alias;
- `pyfunc`: loading a version back as a pyfunc model that answers chat prompts.

This package is also the pyfunc loader module recorded in every registered version's MLmodel
file (``loader_module: reef.registry``): MLflow imports it and calls `_load_pyfunc`, so both must
stay here for versions registered before and after any reshaping of the modules inside.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reef.registry.clients import (
    STORE_SETUP_TIMEOUT_S,
    EnvOverride,
    ensure_experiment,
    s3_endpoint,
)
from reef.registry.names import (
    APPROVAL,
    APPROVALS,
    APPROVED,
    APPROVED_BY,
    CANDIDATE,
    CANDIDATE_KINDS,
    CHAMPION,
    CONTENT_HASH,
    DATA_DIR,
    DATASET_ID,
    DEFAULT_MAX_NEW_TOKENS,
    GATE,
    KIND,
    METRIC_PREFIX,
    MODEL_PREFIX,
    PARENT_ID,
    RECIPE,
    REJECTED,
    RELEASE_FILE,
    RELEASE_FORMAT,
    RELEASE_ID,
    RELEASED,
    STATUS,
    UNRECORDED,
    model_name,
    model_uri,
)
from reef.registry.pyfunc import LOADER_MODULE, ReleaseModel, load, load_release
from reef.registry.registration import register_base, register_candidate
from reef.registry.versions import (
    approval,
    approval_by,
    champion,
    forget_unrecorded,
    get_tags,
    mark,
    set_champion,
    set_tag,
    unrecorded,
    version_for_release,
)

__all__ = [
    "APPROVAL",
    "APPROVALS",
    "APPROVED",
    "APPROVED_BY",
    "CANDIDATE",
    "CANDIDATE_KINDS",
    "CHAMPION",
    "CONTENT_HASH",
    "DATASET_ID",
    "DATA_DIR",
    "DEFAULT_MAX_NEW_TOKENS",
    "GATE",
    "KIND",
    "LOADER_MODULE",
    "METRIC_PREFIX",
    "MODEL_PREFIX",
    "PARENT_ID",
    "RECIPE",
    "REJECTED",
    "RELEASED",
    "RELEASE_FILE",
    "RELEASE_FORMAT",
    "RELEASE_ID",
    "STATUS",
    "STORE_SETUP_TIMEOUT_S",
    "UNRECORDED",
    "EnvOverride",
    "ReleaseModel",
    "approval",
    "approval_by",
    "champion",
    "ensure_experiment",
    "forget_unrecorded",
    "get_tags",
    "load",
    "mark",
    "model_name",
    "model_uri",
    "register_base",
    "register_candidate",
    "s3_endpoint",
    "set_champion",
    "set_tag",
    "unrecorded",
    "version_for_release",
]


def _load_pyfunc(data_path: str, model_config: Mapping[str, Any] | None = None) -> ReleaseModel:
    """MLflow's loader-module entry point (`mlflow.pyfunc.load_model` calls it); the name is
    MLflow's and this package's path is recorded in every registered version."""
    return load_release(data_path, model_config)
