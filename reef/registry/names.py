"""What a human sees in the MLflow UI: registered model names, tag keys, status values, files.

- one registered model per scenario, named ``reef-<scenario>`` (`model_name`); scenario names
  are ``[A-Za-z0-9._-]+``, which MLflow accepts in a model name as they are;
- one model version per candidate (and optionally one for the base release, seq 0), tagged
  ``reef.release_id``, ``reef.parent_id``, ``reef.kind``, ``reef.content_hash``, ``reef.recipe``,
  ``reef.dataset_id``, ``reef.gate`` (the gate's decision), ``reef.status`` (candidate →
  released / rejected ...) and ``reef.metric.<name>`` per evaluation metric;
- the alias ``champion`` on the version of the chain's head;
- ``reef.approval`` ("approved" / "rejected") is the tag a human sets in the UI on a pending
  weights candidate's version, with ``reef.approved_by`` naming who decided (recorded on the
  release; "unnamed" when absent).
"""

from __future__ import annotations

import re

MODEL_PREFIX = "reef-"
CHAMPION = "champion"
RELEASE_FILE = "reef_release.json"
RELEASE_FORMAT = 1
DATA_DIR = "release"  # the pyfunc data directory inside the model: the release's files

# tag keys on a model version
RELEASE_ID = "reef.release_id"
PARENT_ID = "reef.parent_id"
KIND = "reef.kind"
CONTENT_HASH = "reef.content_hash"
RECIPE = "reef.recipe"
DATASET_ID = "reef.dataset_id"
GATE = "reef.gate"
STATUS = "reef.status"
APPROVAL = "reef.approval"
APPROVED_BY = "reef.approved_by"
# A version whose candidate the store did not take (the database away when it was written):
# the scenario's next recover deletes it, or untags it if the write went through after all.
UNRECORDED = "reef.unrecorded"
METRIC_PREFIX = "reef.metric."

# reef.status values written here; `mark` accepts others of the same shape (e.g. "pending")
CANDIDATE, RELEASED, REJECTED = "candidate", "released", "rejected"
APPROVED = "approved"
APPROVALS = (APPROVED, REJECTED)

CANDIDATE_KINDS = ("adapter", "checkpoint", "harness")
DEFAULT_MAX_NEW_TOKENS = 32

_SCENARIO = re.compile(r"^[A-Za-z0-9._-]+$")


def model_name(scenario: str) -> str:
    """The registered model mirroring `scenario`'s chain: ``reef-<scenario>``."""
    if not _SCENARIO.fullmatch(scenario):
        raise ValueError(f"invalid scenario name '{scenario}' (letters, digits, '.', '_', '-')")
    return MODEL_PREFIX + scenario


def model_uri(scenario: str, version: int | str) -> str:
    return f"models:/{model_name(scenario)}/{version}"
