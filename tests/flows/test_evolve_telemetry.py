"""The evolve flow under telemetry and webhooks, against real receivers on loopback: a run and
its steps are spans in one trace (the OTLP receiver decodes them with the official protobuf
classes), and a run that raises is an `evolve.failed` event, stored in the outbox and delivered
signed, with one event id over its retries."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reef.events import Deliverer, verify
from reef.settings import load_settings
from reef.store.sql import open_store
from tests.api.test_telemetry import Receiver as OTLPReceiver
from tests.api.test_webhooks import FAILS, SECRET
from tests.api.test_webhooks import Receiver as HookReceiver

ERROR = 2  # Status.StatusCode.STATUS_CODE_ERROR


@pytest.fixture
def otlp() -> Iterator[OTLPReceiver]:
    r = OTLPReceiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


def test_runs_are_traced_and_a_failed_run_is_an_event(
    tmp_path: Path, prefect_server: None, otlp: OTLPReceiver
) -> None:
    from reef.flows.evolve import evolve

    hooks = HookReceiver(tmp_path / "reef.db")
    hooks.thread.start()
    overrides = {
        "server": {"state_dir": str(tmp_path)},
        "reef": {"recipe": "harness", "batch_size": 4},
        "telemetry": {"otlp_endpoint": otlp.url, "export_interval_s": 0.1},
        "events": {"webhooks": [{"url": f"{hooks.url}/hook", "secret": SECRET}], "backoff_s": 0.1},
    }
    settings = load_settings(**overrides)
    store = open_store(settings.database_url)
    try:
        store.migrate()
        assert evolve("traced", overrides=overrides)["status"] == "not_ready"
        (run,) = otlp.wait("reef.evolve")
        steps = {s["name"]: s for s in otlp.spans if s["trace_id"] == run["trace_id"]}
        assert set(steps) == {"reef.evolve", "reef.evolve.prepare", "reef.evolve.take_batch"}
        for name in ("reef.evolve.prepare", "reef.evolve.take_batch"):
            assert steps[name]["parent_span_id"] == run["span_id"]
        assert run["attributes"]["reef.scenario"] == "traced"
        assert run["attributes"]["reef.status"] == "not_ready"
        assert steps["reef.evolve.prepare"]["attributes"]["reef.recipe"] == "harness"
        assert steps["reef.evolve.take_batch"]["attributes"]["reef.eligible"] == 0
        assert store.recent_deliveries("traced", 10) == []  # not ready is no failure

        broken = copy.deepcopy(overrides)
        broken["reef"]["params"] = {"bogus": 1}  # the recipe refuses it when the run starts
        with pytest.raises(Exception, match="bogus"):
            evolve("traced", overrides=broken)
        failed = next(s for s in otlp.wait("reef.evolve", 2) if s["span_id"] != run["span_id"])
        assert failed["status"] == ERROR
        prepare = [s for s in otlp.spans if s["parent_span_id"] == failed["span_id"]]
        assert [(s["name"], s["status"]) for s in prepare] == [("reef.evolve.prepare", ERROR)]

        (event,) = store.recent_deliveries("traced", 10)
        assert event.kind == "evolve.failed" and "bogus" in event.body
        sender = Deliverer(store, settings.events)
        deadline = time.monotonic() + 30
        while not hooks.accepted():
            assert time.monotonic() < deadline, hooks.posts
            sender.step()
            time.sleep(0.1)
        sender.close()
    finally:
        store.close()
        hooks.server.shutdown()
        hooks.server.server_close()
    tries = hooks.posts
    assert [p["accepted"] for p in tries] == [False] * FAILS + [True]
    assert {p["event"]["id"] for p in tries} == {event.event_id}
    assert all(verify(SECRET, p["body"], p["headers"]["x-reef-signature"]) for p in tries)
    assert tries[-1]["event"]["data"]["error"].startswith("recipe harness: unknown parameter")
