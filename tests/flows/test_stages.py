"""flows.stages: each stage's seconds of an evolve run, what its MLflow run and log show."""

from __future__ import annotations

import time

import pytest

from reef.flows import stages


@stages.timed("nap")
def nap(seconds: float) -> float:
    """A stage: sleeps, then returns its argument."""
    time.sleep(seconds)
    return seconds


@stages.timed("fail")
def fail() -> None:
    raise RuntimeError("boom")


def test_a_clock_adds_each_stage_seconds_in_the_order_they_first_ran():
    with stages.clock() as times:
        assert nap(0.05) == 0.05
        with pytest.raises(RuntimeError):
            fail()  # a stage that raises still took its time
        nap(0.02)
    assert list(times) == ["nap", "fail"]
    assert 0.07 <= times["nap"] < 0.5
    assert times["fail"] >= 0
    metrics = stages.metrics(times, 0.2)
    assert metrics["time.total_s"] == 0.2 and metrics["time.nap_s"] == round(times["nap"], 3)
    assert stages.summary({"train": 3.0, "deploy": 1.0}, 8.0) == (
        "8.0 s in all: train 3.0 s (38%), deploy 1.0 s (12%)"
    )


def test_outside_a_clock_a_stage_runs_untimed_and_the_name_is_kept():
    assert nap(0.0) == 0.0
    assert nap.__name__ == "nap" and nap.__wrapped__.__doc__.startswith("A stage")  # type: ignore[attr-defined]
    with stages.clock() as outer:
        with stages.clock() as inner:  # a run inside a run (a test's flow in a flow) keeps its own
            nap(0.0)
        assert "nap" in inner and "nap" not in outer
