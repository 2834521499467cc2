"""The manual gate: the candidate waits as pending while the flow run is paused for input;
approving it (the MLflow tag on its model version, or the Prefect UI's input form, which is
resume_flow_run with the input) publishes it; rejecting leaves the head alone."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from reef.cli.testing import InProcessReef
from reef.testing.traffic import traffic


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    with InProcessReef(tmp_path_factory.mktemp("manual")) as srv:
        yield srv


def _overrides(srv: InProcessReef) -> dict:
    return {
        "server": {"state_dir": str(srv.state_dir), "port": srv.port},
        "engine": {"model": "tiny"},
        "reef": {"recipe": "sft", "batch_size": 2, "params": {"epochs": 1}},
        "gate": {"policy": "manual", "holdout": 0.0},
    }


def _traffic(srv: InProcessReef, scenario: str) -> None:
    traffic(srv, scenario, 2, report=lambda i, rid: {"score": 1.0}, max_tokens=3)


def _run_until_pending(
    srv: InProcessReef, scenario: str
) -> tuple[dict[str, Any], threading.Thread, dict[str, Any]]:
    from reef.flows.evolve import evolve

    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = evolve(scenario, overrides=_overrides(srv))
        except BaseException as e:  # surfaced by the test below
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        rows = httpx.get(f"{srv.url}/reef/scenarios/{scenario}/candidates").json()["data"]
        if rows and rows[0]["status"] == "pending":
            return rows[0], t, out
        assert "error" not in out, out
        time.sleep(0.5)
    pytest.fail(f"no pending candidate: {out}")


def _finish(t: threading.Thread, out: dict[str, Any]) -> dict[str, Any]:
    t.join(timeout=120)
    assert not t.is_alive()
    if "error" in out:
        raise out["error"]
    return dict(out["result"])


def _head(srv: InProcessReef, scenario: str) -> str:
    return str(httpx.get(f"{srv.url}/reef/scenarios/{scenario}").json()["head_release_id"])


def _approve_by_mlflow_tag(srv: InProcessReef, cand: dict[str, Any], value: str) -> None:
    from reef import registry

    tracking = f"sqlite:///{(srv.state_dir / 'mlflow.db').resolve()}"
    registry.set_tag(tracking, cand["model_uri"], "reef.approval", value)


def _approve_in_prefect(value: bool) -> Callable[[], None]:
    def approve() -> None:
        from prefect import get_client
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState
        from prefect.flow_runs import resume_flow_run

        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(
                    state=FlowRunFilterState(type={"any_": ["PAUSED"]})  # type: ignore[arg-type]
                )
            )
        assert len(runs) == 1
        resume_flow_run(runs[0].id, run_input={"approve": value, "note": "looks good"})

    return approve


@pytest.mark.loop
def test_manual_approval_by_mlflow_tag(server: InProcessReef, prefect_server: None) -> None:
    _traffic(server, "tagged")
    head = _head(server, "tagged")
    cand, t, out = _run_until_pending(server, "tagged")
    time.sleep(3)  # still waiting: nothing moved
    assert _head(server, "tagged") == head
    _approve_by_mlflow_tag(server, cand, "approved")
    result = _finish(t, out)
    assert result["status"] == "published" and result["release_id"] == cand["release_id"]
    assert _head(server, "tagged") == cand["release_id"]


def test_manual_rejection_in_prefect(server: InProcessReef, prefect_server: None) -> None:
    _traffic(server, "ui-no")
    head = _head(server, "ui-no")
    _, t, out = _run_until_pending(server, "ui-no")
    time.sleep(2.5)  # let the pause settle
    _approve_in_prefect(False)()
    result = _finish(t, out)
    assert result["status"] == "rejected"
    assert _head(server, "ui-no") == head
    rows = httpx.get(f"{server.url}/reef/scenarios/ui-no/candidates").json()["data"]
    assert rows[0]["status"] == "rejected"


@pytest.mark.loop
def test_manual_approval_in_prefect(server: InProcessReef, prefect_server: None) -> None:
    _traffic(server, "ui-yes")
    cand, t, out = _run_until_pending(server, "ui-yes")
    time.sleep(2.5)
    _approve_in_prefect(True)()
    result = _finish(t, out)
    assert result["status"] == "published"
    assert _head(server, "ui-yes") == cand["release_id"]


@pytest.mark.loop
def test_promote_through_reef(server: InProcessReef, prefect_server: None) -> None:
    """`POST .../promote` publishes the pending candidate; the paused flow notices and ends."""
    _traffic(server, "promoted")
    cand, t, out = _run_until_pending(server, "promoted")
    r = httpx.post(
        f"{server.url}/reef/scenarios/promoted/promote",
        json={"release_id": cand["release_id"]},
        timeout=120,
    )
    assert r.status_code == 201, r.text
    assert r.json()["operation"] == "promote" and r.json()["current"]
    result = _finish(t, out)
    assert result["status"] == "published"  # by the promote, not by the flow
    assert _head(server, "promoted") == cand["release_id"]
    again = httpx.post(
        f"{server.url}/reef/scenarios/promoted/promote", json={"release_id": cand["release_id"]}
    )
    assert again.status_code == 409
