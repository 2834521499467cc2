"""What the train extra (`reef-agents[train]`) installs, by import name: the `reef` command
names the extra when one of them is missing, and `reef serve` turns its evolve worker off
without them. Imports nothing, so a client-only install reads it."""

from __future__ import annotations

import importlib.util

TRAIN_MODULES = ("prefect", "trl", "accelerate", "datasets", "great_expectations", "gepa", "tqdm")


def missing_train_modules() -> list[str]:
    """The train extra's modules this environment lacks."""
    return [m for m in TRAIN_MODULES if importlib.util.find_spec(m) is None]
