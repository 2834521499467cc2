"""Candidates: what registering one writes (files, MLflow version, row) and the release each
becomes on the chain.

Registering is three writes, in this order: the candidate's files go to the artifact store
(content-addressed), a model version of `reef-<scenario>` goes to MLflow (tags: gate, dataset,
parent, recipe, content hash), then the candidates row. The row comes last, so a candidate
Reef knows of always has its files and its version.

Shapes: a weights candidate carries new files; a harness candidate carries a harness tree and
keeps the weights of the head it was made on (`harness_release`). Rollback and promote make a
release from an existing one (`rolled_back`, `promoted`).
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reef import registry
from reef.artifacts import ArtifactStore, tree_hash
from reef.errors import ReefError
from reef.gate import Decision
from reef.harness import Harness, harness_of
from reef.provenance import Provenance
from reef.records import Candidate, Release, new_id, utcnow
from reef.settings import Settings

# A gate's verdict -> the status its candidate is registered with. An accepted candidate is
# "pending" until it is published: the head moves only in deploy.release.deploy.
STATUS_OF = {"accepted": "pending", "pending": "pending", "rejected": "rejected"}


# shapes ---------------------------------------------------------------------------------------
def harness_release(parent: Release, ref: Mapping[str, Any], **fields: Any) -> Release:
    """A release that changes the harness only: the parent's weights, `ref`'s harness. `fields`
    override the rest (id, operation, content_hash, gate, ...)."""
    values: dict[str, Any] = {
        "id": new_id("rel"),
        "operation": "harness",
        "content_hash": ref.get("content_hash"),
        "recipe": None,
        "dataset_id": None,
        "metrics": {},
        "gate": {},
        **fields,
    }
    # the MLflow version of the weights it serves: the parent's own, unless the parent itself
    # only changed the harness (then the one it names)
    if "weights_release_id" in parent.metadata:
        weights_model_uri = parent.metadata.get("weights_model_uri")
    else:
        weights_model_uri = parent.model_uri
    return dataclasses.replace(
        parent,
        seq=0,
        parent_id=parent.id,
        created_at=utcnow(),
        metadata={
            **parent.metadata,
            "harness": dict(ref),
            "weights_release_id": parent.weights_id,
            "weights_model_uri": weights_model_uri,
        },
        **values,
    )


def rolled_back(target: Release, head: Release) -> Release:
    """`target`'s content republished on top of `head` (operation "rollback")."""
    return dataclasses.replace(
        target,
        id=new_id("rel"),
        parent_id=head.id,
        operation="rollback",
        created_at=utcnow(),
        model_uri=None,
        metadata={**target.metadata, "source_release_id": target.id},
    )


def promoted(cand: Candidate, head: Release) -> Release:
    """The release a promoted candidate becomes on top of today's head. A harness candidate
    brings only its harness: it keeps whatever weights the head serves now."""
    release = cand.release("promote")
    if cand.operation == "harness":  # today's head's weights, the candidate's harness
        rebased = harness_release(head, cand.metadata["harness"])
        return dataclasses.replace(
            release,
            parent_id=head.id,
            kind=rebased.kind,
            uri=rebased.uri,
            metadata=rebased.metadata,
        )
    return dataclasses.replace(
        release,
        parent_id=head.id,  # reviewed against the head it replaces now
        metadata={**release.metadata, "trained_on": cand.parent_id},
    )


# registering ------------------------------------------------------------------------------
def store_harness(artifacts: ArtifactStore, scenario: str, harness: Harness) -> dict[str, Any]:
    """Put a validated harness's files in the artifact store (content-addressed: the same files
    are one tree); returns the reference a release carries."""
    harness.validate()
    digest = harness.content_hash()
    key = f"harness/{scenario}/{digest.removeprefix('sha256:')}"
    with tempfile.TemporaryDirectory(prefix="reef-harness-") as tmp:
        harness.write(Path(tmp))
        uri = artifacts.put_tree(key, Path(tmp))
    return {"key": key, "uri": uri, "content_hash": digest, "files": len(harness.files)}


def _mlflow(settings: Settings) -> dict[str, Any]:
    return {
        "artifact_location": settings.mlflow_artifact_location,
        "s3_endpoint_url": settings.artifacts.s3_endpoint_url,
    }


def harness_version(
    settings: Settings, release: Release, harness: Harness, provenance: Provenance, *, gate: str
) -> str:
    """A model version of the scenario's registered model for `release`'s harness (a release
    or candidate shaped by `harness_release`): its files as the version's artifacts, the same
    tags as weights, and which weights it is served with."""
    ref = harness_of(release)
    assert ref is not None, f"release {release.id} carries no harness"
    with tempfile.TemporaryDirectory(prefix="reef-harness-") as tmp:
        harness.write(Path(tmp))
        return registry.register_candidate(
            settings.tracking_uri,
            release.scenario,
            release.id,
            Path(tmp),
            provenance,
            kind="harness",
            parent_id=release.parent_id,
            content_hash=str(ref["content_hash"]),
            gate=gate,
            extra={
                "weights_release_id": release.weights_id,
                "weights_model_uri": release.metadata.get("weights_model_uri"),
                **provenance.tags,
            },
            **_mlflow(settings),
        )


def weights_version(settings: Settings, release: Release, files: Path | None) -> str:
    """A model version for a release made from another (rollback, promote): its weights files,
    or the base model's name for the base."""
    if release.kind == "base":
        return registry.register_base(
            settings.tracking_uri,
            release.scenario,
            release.id,
            settings.engine.model,
            **_mlflow(settings),
        )
    if files is None:
        raise ReefError(f"release {release.id} has no files to register", code="no_files")
    return registry.register_candidate(
        settings.tracking_uri,
        release.scenario,
        release.id,
        files,
        provenance_of(release, base_model=settings.engine.model),
        kind=release.kind,
        parent_id=release.parent_id or "",
        content_hash=release.content_hash or "",
        gate=release.operation,
        **_mlflow(settings),
    )


def provenance_of(release: Release, base_model: str | None = None) -> Provenance:
    """What a release made from another (rollback, promote) was made of: its own recipe,
    dataset and numeric metrics."""
    return Provenance(
        recipe=release.recipe or "",
        dataset_id=release.dataset_id or "",
        metrics={k: float(v) for k, v in release.metrics.items() if isinstance(v, (int, float))},
        base_model=base_model,
    )


def weights_candidate(
    settings: Settings,
    artifacts: ArtifactStore,
    head: Release,
    files: Path,
    kind: str,
    decision: Decision,
    provenance: Provenance,
) -> Candidate:
    """The candidate (not yet stored) for trained files: files to the artifact store, a model
    version in MLflow with the gate's result and `provenance`."""
    digest = tree_hash(files)
    uri = artifacts.put_tree(f"releases/{head.scenario}/{digest}", files)
    release_id = new_id("rel")
    model_uri = registry.register_candidate(
        settings.tracking_uri,
        head.scenario,
        release_id,
        files,
        provenance,
        kind=kind,
        parent_id=head.id,
        content_hash=digest,
        gate=decision.status,
        extra=dict(provenance.tags),
        **_mlflow(settings),
    )
    now = utcnow()
    return Candidate(
        id=release_id,
        scenario=head.scenario,
        parent_id=head.id,
        kind=kind,
        created_at=now,
        status=STATUS_OF[decision.status],
        uri=uri,
        content_hash=digest,
        recipe=provenance.recipe,
        dataset_id=provenance.dataset_id,
        metrics=dict(provenance.metrics),
        gate=decision.as_dict(),
        model_uri=model_uri,
        updated_at=now,
        message=None if decision.status != "rejected" else decision.reason,
        metadata=dict(provenance.metadata),
    )


def harness_candidate(
    settings: Settings,
    artifacts: ArtifactStore,
    head: Release,
    harness: Harness,
    decision: Decision,
    provenance: Provenance,
) -> Candidate:
    """The candidate (not yet stored) for a new harness on `head`: its files to the artifact
    store, a model version in MLflow (its files as artifacts). Published, it keeps `head`'s
    weights."""
    ref = store_harness(artifacts, head.scenario, harness)
    shape = harness_release(head, ref)
    model_uri = harness_version(settings, shape, harness, provenance, gate=decision.status)
    now = utcnow()
    return Candidate(
        id=shape.id,
        scenario=head.scenario,
        parent_id=head.id,
        kind=head.kind,
        created_at=now,
        status=STATUS_OF[decision.status],
        uri=head.uri,
        content_hash=str(ref["content_hash"]),
        recipe=provenance.recipe,
        dataset_id=provenance.dataset_id,
        metrics=dict(provenance.metrics),
        gate=decision.as_dict(),
        model_uri=model_uri,
        updated_at=now,
        message=None if decision.status == "accepted" else decision.reason,
        operation="harness",
        metadata={**shape.metadata, **provenance.metadata},
    )
