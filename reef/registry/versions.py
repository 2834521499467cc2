"""Model versions: finding them, their tags and the ``champion`` alias.

MLflow has no compare-and-swap, so the chain itself lives in Reef's database; these functions
only mirror it onto the versions.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from reef.registry.clients import does_not_exist, mlflow_client
from reef.registry.names import (
    APPROVAL,
    APPROVALS,
    APPROVED_BY,
    CHAMPION,
    RELEASE_ID,
    RELEASED,
    STATUS,
    UNRECORDED,
    model_name,
)

log = logging.getLogger(__name__)

_STATUS = re.compile(r"^[a-z][a-z0-9_]*$")
_MODEL_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:/(?P<version>\d+)|@(?P<alias>[\w-]+))$")


def version_of(client: Any, model_uri_or_version: str | int, scenario: str | None = None) -> Any:
    """The ModelVersion a ``models:/name/N`` or ``models:/name@alias`` URI (or, with
    `scenario`, a bare version number) names."""
    text = str(model_uri_or_version)
    if text.isdigit():
        if scenario is None:
            raise ValueError(f"a bare version ({text}) needs a scenario")
        return client.get_model_version(model_name(scenario), text)
    m = _MODEL_URI.fullmatch(text)
    if not m:
        raise ValueError(f"not a registered model URI (models:/<name>/<version>): '{text}'")
    if scenario is not None and m["name"] != model_name(scenario):
        raise ValueError(f"{text} is not a version of {model_name(scenario)}")
    if m["alias"]:
        return client.get_model_version_by_alias(m["name"], m["alias"])
    return client.get_model_version(m["name"], m["version"])


def set_champion(
    tracking_uri: str,
    scenario: str,
    model_uri_or_version: str | int,
    *,
    registry_uri: str | None = None,
) -> None:
    """Point the alias ``champion`` (the chain's head) at a version and tag it released. The
    caller moves the head in Reef's database first; this only mirrors it."""
    client = mlflow_client(tracking_uri, registry_uri)
    mv = version_of(client, model_uri_or_version, scenario)
    # tag first: whatever `champion` points at is always tagged released
    client.set_model_version_tag(mv.name, mv.version, STATUS, RELEASED)
    client.set_registered_model_alias(mv.name, CHAMPION, mv.version)


def champion(
    tracking_uri: str, scenario: str, *, registry_uri: str | None = None
) -> tuple[int, str] | None:
    """(version, release id) of the version the alias ``champion`` names; None when there is no
    registered model or no champion yet."""
    from mlflow.exceptions import MlflowException

    client = mlflow_client(tracking_uri, registry_uri)
    name = model_name(scenario)
    try:
        # read the alias off the registered model: a missing alias is no error then (MLflow
        # answers get_model_version_by_alias for one with INVALID_PARAMETER_VALUE)
        version = client.get_registered_model(name).aliases.get(CHAMPION)
    except MlflowException as e:
        if does_not_exist(e):
            return None
        raise
    if version is None:
        return None
    mv = client.get_model_version(name, str(version))
    return int(mv.version), mv.tags.get(RELEASE_ID, "")


def version_for_release(
    tracking_uri: str, scenario: str, release_id: str, *, registry_uri: str | None = None
) -> str | None:
    """``models:/reef-<scenario>/<version>`` of the version tagged with `release_id`, or None."""
    client = mlflow_client(tracking_uri, registry_uri)
    name = model_name(scenario)
    quoted = release_id.replace("'", "\\'")
    found = client.search_model_versions(
        f"name = '{name}' and tags.`{RELEASE_ID}` = '{quoted}'",
        order_by=["version_number DESC"],
        max_results=1,
    )
    return f"models:/{name}/{found[0].version}" if found else None


def unrecorded(
    tracking_uri: str, scenario: str, *, registry_uri: str | None = None
) -> list[tuple[str, str]]:
    """(model URI, release id) of the scenario's versions tagged UNRECORDED, oldest first."""
    client = mlflow_client(tracking_uri, registry_uri)
    name = model_name(scenario)
    found = client.search_model_versions(
        f"name = '{name}' and tags.`{UNRECORDED}` = 'true'", order_by=["version_number ASC"]
    )
    return [(f"models:/{name}/{mv.version}", mv.tags.get(RELEASE_ID, "")) for mv in found]


def forget_unrecorded(
    tracking_uri: str, model_uri: str, recorded: bool, *, registry_uri: str | None = None
) -> None:
    """An UNRECORDED version settled: its tag removed when the store has its candidate after
    all (`recorded`), else the version deleted (nothing in Reef names it)."""
    client = mlflow_client(tracking_uri, registry_uri)
    mv = version_of(client, model_uri)
    if recorded:
        client.delete_model_version_tag(mv.name, mv.version, UNRECORDED)
    else:
        client.delete_model_version(mv.name, mv.version)


def get_tags(
    tracking_uri: str, model_uri: str, *, registry_uri: str | None = None
) -> dict[str, str]:
    """All tags of the version `model_uri` names."""
    mv = version_of(mlflow_client(tracking_uri, registry_uri), model_uri)
    return dict(mv.tags)


def set_tag(
    tracking_uri: str, model_uri: str, key: str, value: str, *, registry_uri: str | None = None
) -> None:
    client = mlflow_client(tracking_uri, registry_uri)
    mv = version_of(client, model_uri)
    client.set_model_version_tag(mv.name, mv.version, key, str(value))


def mark(
    tracking_uri: str, model_uri: str, status: str, *, registry_uri: str | None = None
) -> None:
    """Set ``reef.status`` ("candidate", "pending", "released", "rejected", ...)."""
    if not _STATUS.fullmatch(status):
        raise ValueError(f"invalid status '{status}' (lower-case word)")
    set_tag(tracking_uri, model_uri, STATUS, status, registry_uri=registry_uri)


def approval(tracking_uri: str, model_uri: str, *, registry_uri: str | None = None) -> str | None:
    """The human decision on a pending candidate: "approved", "rejected", or None while the
    ``reef.approval`` tag is absent (or holds anything else, which is logged)."""
    return approval_by(tracking_uri, model_uri, registry_uri=registry_uri)[0]


def approval_by(
    tracking_uri: str, model_uri: str, *, registry_uri: str | None = None
) -> tuple[str | None, str | None]:
    """The decision (as `approval`) and who made it: the ``reef.approved_by`` tag, if set."""
    tags = get_tags(tracking_uri, model_uri, registry_uri=registry_uri)
    value, by = tags.get(APPROVAL), tags.get(APPROVED_BY)
    if value is None:
        return None, by
    decision = value.strip().lower()
    if decision in APPROVALS:
        return decision, by
    log.warning("%s: ignoring %s=%r (expected approved or rejected)", model_uri, APPROVAL, value)
    return None, by
