"""Engine fixtures: the tiny model, and embedded engines running on it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from reef.models import resolve_model


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The deterministic tiny model, generated once per session in a private cache."""
    return resolve_model("tiny", tmp_path_factory.mktemp("models"))


@contextmanager
def running_engine(model_dir: Path, **kwargs: Any) -> Iterator[Any]:
    """An EmbeddedEngine started for the block; each test drives it with its own event loop
    (the engine's scheduler thread answers on whichever loop submitted a request). `kwargs`:
    keys of engine.embedded (EmbeddedSettings), and default_max_tokens / sampling_defaults."""
    from reef.engines.embedded import EmbeddedEngine
    from reef.settings import EmbeddedSettings

    section = {k: kwargs.pop(k) for k in list(kwargs) if k in EmbeddedSettings.model_fields}
    engine = EmbeddedEngine(model_dir, "tiny", EmbeddedSettings(**section), **kwargs)
    asyncio.run(engine.start())
    try:
        yield engine
    finally:
        asyncio.run(engine.aclose())


@pytest.fixture(scope="module")
def engine(tiny_dir: Path) -> Iterator[Any]:
    """A shared engine for tests that do not look at its counters."""
    with running_engine(tiny_dir, max_batch_size=8, default_max_tokens=16) as e:
        yield e
