"""The evolve worker looks at every scenario as it starts, not only when a report names one: a
batch left ready while no worker ran (the API process killed in the middle of a deploy, the
run it drove failing with it) trains without waiting for the scenario's next report
(tests/faults/test_api_kills.py is the whole story, with real processes). Here: the real
Worker on a real SQLite store, its run replaced by a note of what it was asked to run, and
Prefect's temporary server and the trainer's imports skipped."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from reef.cli import worker as worker_cli
from reef.settings import load_settings
from reef.store.sql import open_store


def test_the_worker_scans_every_scenario_at_its_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'reef.db'}"
    store = open_store(url)
    try:
        store.migrate()
        for name in ("support", "billing"):
            store.ensure_scenario(name)
        scenarios = sorted(s.name for s in store.list_scenarios())
    finally:
        store.close()
    monkeypatch.setattr(worker_cli, "warmup", lambda: None)
    settings = load_settings(None, store={"database_url": url})
    worker = worker_cli.Worker(settings, None, {})
    worker._preload = threading.Thread(target=lambda: None)
    asked: list[tuple[str, bool]] = []
    monkeypatch.setattr(
        worker, "_evolve", lambda scenario, scanned=False: asked.append((scenario, scanned))
    )
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while len(asked) < len(scenarios) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        worker.stop()
    # no report arrived: the start alone asked for a look at each
    assert {"support", "billing"} <= set(scenarios)
    assert sorted(asked) == [(name, True) for name in scenarios]


def test_a_store_away_is_one_warning_and_one_line_when_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The schedule's scans while the store is away: one warning, no traceback, then one line
    when a scan reads the store again (the real Worker, its dispatcher called directly)."""
    url = f"sqlite:///{tmp_path / 'reef.db'}"
    settings = load_settings(None, store={"database_url": url})
    worker = worker_cli.Worker(settings, None, {})
    worker._preload = threading.Thread(target=lambda: None)
    worker._preload.start()
    (tmp_path / "reef.db").mkdir()  # a path SQLite cannot open: every read fails
    caplog.set_level("DEBUG", logger="reef.worker")
    for _ in range(3):
        worker.notify(worker_cli.Trigger.scan())
        worker.dispatch()
    away = [r for r in caplog.records if r.name == "reef.worker" and r.levelname == "WARNING"]
    assert len(away) == 1 and "unavailable" in away[0].getMessage()
    assert all(r.exc_info is None for r in caplog.records)
    (tmp_path / "reef.db").rmdir()
    store = open_store(url)
    store.migrate()
    store.close()
    worker.notify(worker_cli.Trigger.scan())
    worker.dispatch()
    assert any("back after" in r.getMessage() for r in caplog.records)
