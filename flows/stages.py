"""Seconds each stage of an evolve run took (materialize, validate, train, evaluate, gate,
register, deploy, ...), for the run's MLflow metrics (`time.<stage>_s`) and its log: where a
round's time goes, without reading Prefect's database.

The stage tasks carry `@timed(name)` under their `@task`; the flow opens a `clock()` around
the run. A task that runs twice in one run (the composite's two evaluations) adds up."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

# The running flow's times: Prefect runs a task called from the flow in the caller's context
# (or a copy of it, which shares the dict).
_TIMES: ContextVar[dict[str, float] | None] = ContextVar("reef_stage_times", default=None)


@contextmanager
def clock() -> Iterator[dict[str, float]]:
    """Collect the stages' seconds of what runs inside, in the order they first ran."""
    times: dict[str, float] = {}
    token = _TIMES.set(times)
    try:
        yield times
    finally:
        _TIMES.reset(token)


def timed(stage: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Add the function's seconds to the open clock's `stage` (a no-op outside one)."""

    def wrap(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)  # Prefect reads the signature and name through __wrapped__
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                times = _TIMES.get()
                if times is not None:
                    times[stage] = times.get(stage, 0.0) + time.perf_counter() - started

        return run

    return wrap


def metrics(times: dict[str, float], total_s: float) -> dict[str, Any]:
    """The MLflow metrics of a run's times: `time.<stage>_s`, and `time.total_s`."""
    out = {f"time.{k}_s": round(v, 3) for k, v in times.items()}
    out["time.total_s"] = round(total_s, 3)
    return out


def record(times: dict[str, float], started: float, logger: Any, what: str) -> None:
    """Write the run's times since `started` (perf_counter) to the active MLflow run, and a
    line to `logger`."""
    import mlflow

    total_s = time.perf_counter() - started
    mlflow.log_metrics(metrics(times, total_s))
    logger.info("%s: %s", what, summary(times, total_s))


def summary(times: dict[str, float], total_s: float) -> str:
    """One log line: each stage's seconds and share of the run."""
    shown = ", ".join(f"{k} {v:.1f} s ({v / total_s:.0%})" for k, v in times.items())
    return f"{total_s:.1f} s in all: {shown}"
