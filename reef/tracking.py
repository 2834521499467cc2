"""Experiment tracking: a dataset snapshot logged to MLflow as an input of the active run, and
run parameters cleared of secrets before they are logged.

MLflow is imported only here and only when logging (it takes seconds to import). The snapshot
is logged as metadata, never as data: name "<scenario>/<kind>", digest = the snapshot's
content hash, source = its artifact URI, schema = its Arrow schema as an MLflow schema.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from pydantic import SecretStr

from reef.datasets import Snapshot

DIGEST_CHARS = 16  # MLflow suggests short digests; 16 hex chars of sha256 stay unambiguous


def _mlflow_type(t: pa.DataType) -> Any:
    from mlflow.types.schema import Array, DataType, Object, Property

    if pa.types.is_list(t):
        return Array(_mlflow_type(t.value_type))
    if pa.types.is_struct(t):
        return Object([Property(f.name, _mlflow_type(f.type), f.nullable) for f in t])
    if pa.types.is_string(t):
        return DataType.string
    if pa.types.is_int64(t):
        return DataType.long
    if pa.types.is_integer(t):
        return DataType.integer
    if pa.types.is_floating(t):
        return DataType.double
    if pa.types.is_boolean(t):
        return DataType.boolean
    raise TypeError(f"no MLflow type for Arrow type {t}")


def mlflow_schema(schema: pa.Schema) -> Any:
    """The Arrow schema of a snapshot as an MLflow column schema."""
    from mlflow.types.schema import ColSpec, Schema

    return Schema([ColSpec(_mlflow_type(f.type), f.name, not f.nullable) for f in schema])


def log_snapshot_input(
    snapshot: Snapshot, *, context: str = "training", tags: dict[str, str] | None = None
) -> None:
    """Log `snapshot` as a dataset input of the active MLflow run (one must be active)."""
    import mlflow
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    if mlflow.active_run() is None:
        raise RuntimeError("log_snapshot_input needs an active MLflow run")
    with warnings.catch_warnings():
        # MLflow registers its local artifact source twice (schemes "" and "file") and warns
        # that a file:// URI is ambiguous; both resolve to the same class.
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(snapshot.uri)
    # MLflow's stubs leave `profile` abstract; MetaDataset implements it (returns None)
    dataset = MetaDataset(  # type: ignore[abstract]
        source,
        name=f"{snapshot.scenario}/{snapshot.kind}",
        digest=snapshot.content_hash[:DIGEST_CHARS],
        schema=mlflow_schema(snapshot.schema),
    )
    all_tags = {
        "reef.content_hash": snapshot.content_hash,
        "reef.rows": str(snapshot.rows),
        "reef.key": snapshot.key,
        **(tags or {}),
    }
    mlflow.log_input(dataset, context=context, tags=all_tags)


MASK = "**********"
# A parameter whose name says it holds a secret (`*_env` names an environment variable: the
# name of the place a secret is, not the secret).
_SECRET_NAME = re.compile(
    r"(?:^|[._-])(?:password|passwd|secret|token|api_?key|credentials?)(?:$|[._-])", re.IGNORECASE
)
# The password in a URL: scheme://user:PASSWORD@host
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://[^/@:\s]*:)[^@\s]*@", re.IGNORECASE)


def public_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """`params` safe to log to MLflow (or anywhere a human reads): a SecretStr value, or any
    value under a secret-sounding name (password, secret, token, api key, credential), becomes
    '**********'; a password inside a URL is masked."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, SecretStr) or (
            value is not None and _SECRET_NAME.search(key) and not key.endswith("_env")
        ):
            out[key] = MASK
        elif isinstance(value, str):
            out[key] = _URL_PASSWORD.sub(rf"\g<head>{MASK}@", value)
        else:
            out[key] = value
    return out
