"""The local evolve worker: a process `reef serve` starts beside the API, so training never
runs in the API process.

It reads scenario names on stdin (the API writes one per report), coalesces them, and for each
scenario whose eligible samples reach `batch_size` starts the evolve flow: in this process when
no Prefect server is configured (Prefect's temporary server starts once, at the first run), or
as a run of the `evolve/evolve` deployment when PREFECT_API_URL points at a server (a Prefect
worker of the deployment's work pool then runs it). With `reef.schedule_s` it also checks every
scenario on that interval. Users' jobs (POST /reef/train) run the instruct flow the same way.
With `store.retention_days` it archives old records and reports every hour (reef.retention).

Each run has a thread of its own, one per scenario (or job) at a time: a run that waits, such
as a manual gate's candidate waiting for approval, never holds up another scenario's evolve
run or a user's job. A scenario reported on while its run is in progress is looked at again
when that run ends.

    python -m flows.worker [--config cfg.yaml] [--overrides JSON]
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reef.errors import ReefError
from reef.settings import Settings, conceal, load_settings, secret_names, split_secrets

log = logging.getLogger("reef.worker")

DEPLOYMENT = "evolve/evolve"
# How often retention runs here: rows cross the window continuously, an hour late is nothing
# next to a window of days, and each run walks only the rows past the cutoff.
RETENTION_EVERY_S = 3600.0
INSTRUCT_DEPLOYMENT = "instruct/instruct"


# A line `job <scenario> <job id>` on stdin is a user's job; any other line is a scenario name.
JOB_PREFIX = "job "


def prefect_server() -> str | None:
    """The Prefect API this process talks to, when one is configured (Prefect's setting)."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def ready(settings: Settings, scenario: str, kind: str) -> tuple[bool, int]:
    from reef.readiness import readiness
    from reef.store.sql import open_store

    store = open_store(settings.database_url)
    try:
        r = readiness(store, scenario, settings.reef, kind)
    finally:
        store.close()
    return r.ready, r.eligible


def run_once(
    settings: Settings, scenario: str, config: str | None, overrides: dict[str, Any]
) -> dict[str, Any]:
    """Evolve `scenario` now: locally, or by submitting a deployment run (unless a run of it
    is still in flight: that run owns the batch)."""
    if prefect_server():
        from prefect.deployments import run_deployment

        running = in_flight_run(scenario)
        if running is not None:
            return {"status": "in_flight", "flow_run_id": running}
        # The run executes on another host, in the deployment's directory: absolute paths only.
        where = str(Path(config).resolve()) if config else None
        run: Any = run_deployment(
            DEPLOYMENT,
            parameters={"scenario": scenario, "config": where, "overrides": _public(overrides)},
            timeout=0,  # submit; the deployment's worker runs it
        )
        return {"status": "submitted", "flow_run_id": str(run.id)}
    from flows.evolve import evolve

    return evolve(scenario, config=config, overrides=conceal(overrides))


def _public(overrides: dict[str, Any]) -> dict[str, Any]:
    """What a deployment run may be told: never a secret setting (a Prefect parameter is stored
    and shown in the UI). The run finds those where it runs: its settings file or REEF_* env."""
    public, secret = split_secrets(overrides)
    if secret:
        log.info(
            "secret settings (%s) are not sent to the deployment run: its worker's settings "
            "file or REEF_* environment provides them",
            ", ".join(secret_names(secret)),
        )
    return public


def run_job(
    settings: Settings, scenario: str, job_id: str, config: str | None, overrides: dict[str, Any]
) -> dict[str, Any]:
    """Run a user's job (POST /reef/train: the instruct flow) now, or submit it to Prefect."""
    if prefect_server():
        from prefect.deployments import run_deployment

        where = str(Path(config).resolve()) if config else None
        run: Any = run_deployment(
            INSTRUCT_DEPLOYMENT,
            parameters={
                "scenario": scenario,
                "job_id": job_id,
                "config": where,
                "overrides": _public(overrides),
            },
            timeout=0,
        )
        return {"status": "submitted", "flow_run_id": str(run.id)}
    from flows.instruct import instruct

    return instruct(scenario, job_id, config=config, overrides=conceal(overrides))


def _preload() -> None:
    """Import what the first evolve run needs (~30 s of imports on 2 busy cores) while
    Prefect's server starts, instead of after the first batch is ready."""
    import great_expectations  # noqa: F401
    import mlflow  # noqa: F401
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import trl  # noqa: F401

    # What these imports loaded lives as long as the process: move it out of the collector's
    # sight, as the API process does (api/app.py). Measured: accelerate runs gc.collect() at
    # the end of every training, and each full collection scanned ~775k objects for ~1.2 s.
    gc.collect()
    gc.freeze()


def _warmup() -> None:
    from prefect import flow

    @flow(name="reef-worker-warmup")
    def warmup() -> None:
        return None

    warmup()


def in_flight(flow_run_id: str) -> bool:
    """Whether a submitted run has not reached a final state yet (it owns its batch until then:
    its samples are consumed only when it has trained)."""
    from prefect import get_client

    with get_client(sync_client=True) as client:
        run = client.read_flow_run(flow_run_id)  # type: ignore[arg-type]
    return run.state is None or not run.state.is_final()


def in_flight_run(scenario: str) -> str | None:
    """The id of a run of the evolve deployment for `scenario` not in a final state yet, if
    any. Replicas share the Prefect server but not their workers' memory of what they
    submitted: each replica's worker (and `reef evolve`) asks here first, so N replicas that
    see the same batch ready start one run, not N that train the same samples and all but one
    lose the head's compare-and-swap (HeadMoved). Two submissions in the same instant can still
    both start; the compare-and-swap keeps the second from publishing."""
    from prefect import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import TERMINAL_STATES

    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name(DEPLOYMENT)
        runs = client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])),
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(
                    type=FlowRunFilterStateType(not_any_=sorted(TERMINAL_STATES))
                )
            ),
        )
    return next((str(r.id) for r in runs if r.parameters.get("scenario") == scenario), None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flows.worker", description=__doc__)
    p.add_argument("--config", help="YAML settings file (as given to reef serve)")
    p.add_argument("--overrides", default="{}", help="settings from CLI flags, as JSON")
    args = p.parse_args(argv)
    overrides = json.loads(args.overrides)
    settings = load_settings(Path(args.config) if args.config else None, **overrides)
    logging.basicConfig(
        level=settings.server.log_level.upper(),
        format="%(asctime)s %(levelname)s reef.worker: %(message)s",
    )
    # Great Expectations logs ~40 INFO lines per validation about its own plugins.
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    from reef.recipe import evolves_with, recipe_class

    kind = recipe_class(settings.reef.recipe).kind
    # With an upstream engine and a weights recipe there is nothing to train: user jobs only.
    evolving = evolves_with(settings.engine.kind, settings.reef.recipe)
    pending: queue.SimpleQueue[str | None] = queue.SimpleQueue()
    # scenario -> its deployment run still owning a batch (written by the run threads)
    submitted: dict[str, str] = {}

    def read_stdin() -> None:
        for line in sys.stdin:
            if line.strip():
                pending.put(line.strip())
        pending.put(None)  # the API process is gone: finish and exit

    threading.Thread(target=read_stdin, name="reef-worker-stdin", daemon=True).start()
    preload = threading.Thread(target=_preload, name="reef-worker-preload", daemon=True)
    preload.start()
    if not prefect_server():
        # Prefect's temporary server takes ~14 s to start: pay it now, not after a report.
        try:
            _warmup()
        except Exception as e:  # the first evolve run tries again
            log.warning("warming up Prefect failed: %s", e)
    log.info(
        "evolve worker ready (recipe %s, batch %d)", settings.reef.recipe, settings.reef.batch_size
    )
    runs = Runs()
    _start_judging(settings, pending)
    _start_retention(settings)
    while True:
        try:
            name = pending.get(timeout=settings.reef.schedule_s)
        except queue.Empty:
            name = "*"  # the schedule: look at every scenario
        if name is None:
            runs.join()
            return 0
        names = {name}
        while True:  # coalesce a burst of reports into one check per scenario
            try:
                more = pending.get_nowait()
            except queue.Empty:
                break
            if more is None:
                runs.join()
                return 0
            names.add(more)
        for line in sorted(n for n in names if n.startswith(JOB_PREFIX)):
            names.discard(line)
            _, scenario, job_id = line.split()
            # users wait on these: each starts at once, beside any evolve run
            runs.start(f"job {job_id}", _job, settings, scenario, job_id, args.config, overrides)
        if not evolving:
            continue
        # Evolve runs import trl's trainers in their own threads; a thread resolving its lazy
        # module while the preload does can fail with "cannot import name 'SFTConfig' from
        # 'trl'". They start once the preload is done (users' jobs need no trainer).
        preload.join()
        if "*" in names:
            from reef.store.sql import open_store

            store = open_store(settings.database_url)
            try:
                names = {s.name for s in store.list_scenarios()}
            finally:
                store.close()
        for scenario in sorted(names):
            if runs.running(f"evolve {scenario}"):
                # looked at again when this run ends: the batch it trains is not this one
                runs.again(f"evolve {scenario}", functools.partial(pending.put, scenario))
                continue
            if scenario in submitted and _in_flight_safe(submitted[scenario]):
                continue
            runs.start(
                f"evolve {scenario}",
                _evolve,
                settings,
                scenario,
                kind,
                args.config,
                overrides,
                submitted,
            )


def _start_judging(settings: Settings, pending: queue.SimpleQueue[str | None]) -> None:
    """When judging is on (flows/judging.py), a thread that judges new turns and hands each
    scenario that got judgments to the loop above, which checks its readiness."""
    from flows.judging import Judging, judging_enabled

    if not judging_enabled(settings):
        return
    from reef.store.sql import open_store

    judging = Judging(settings, open_store(settings.database_url))
    stop = threading.Event()
    threading.Thread(
        target=judging.run_forever,
        args=(stop, pending.put),
        name="reef-worker-judging",
        daemon=True,
    ).start()
    log.info("judging next turns and text-only reports every %.1f s", settings.judge.poll_s)


def _start_retention(settings: Settings) -> None:
    """With `store.retention_days`, a thread that archives and deletes old rows now and then
    every RETENTION_EVERY_S (reef.retention); a failed run is logged and tried again then."""
    if settings.store.retention_days is None:
        return
    from reef.artifacts import artifacts_for
    from reef.retention import apply_retention
    from reef.store.sql import open_store

    def run_forever() -> None:
        store = open_store(settings.database_url)
        artifacts = artifacts_for(settings)
        while True:
            try:
                apply_retention(store, settings, artifacts)
            except ReefError as e:
                log.warning("retention failed, retried in %.0f s: %s", RETENTION_EVERY_S, e)
            time.sleep(RETENTION_EVERY_S)

    threading.Thread(target=run_forever, name="reef-worker-retention", daemon=True).start()
    log.info("archiving records older than %s days every hour", settings.store.retention_days)


class Runs:
    """The worker's runs, one thread each: a run that waits (a manual gate's approval, a long
    training) never holds up another scenario's run or a user's job. One run per key at a
    time (`evolve <scenario>`, `job <id>`)."""

    def __init__(self) -> None:
        self._threads: dict[str, threading.Thread] = {}
        self._again: dict[str, Callable[[], None]] = {}
        self._lock = threading.Lock()

    def again(self, key: str, then: Callable[[], None]) -> None:
        """Call `then` when the run under `key` ends (once, however often this is asked)."""
        with self._lock:
            self._again[key] = then

    def running(self, key: str) -> bool:
        with self._lock:
            thread = self._threads.get(key)
            return thread is not None and thread.is_alive()

    def start(self, key: str, target: Any, *args: Any) -> bool:
        with self._lock:
            thread = self._threads.get(key)
            if thread is not None and thread.is_alive():
                return False

            def run() -> None:
                try:
                    target(*args)
                finally:
                    with self._lock:
                        then = self._again.pop(key, None)
                    if then is not None:
                        then()

            thread = threading.Thread(target=run, name=f"reef-{key}", daemon=True)
            self._threads[key] = thread
            thread.start()
            return True

    def join(self) -> None:
        """Wait for the runs in progress (the API process is gone: finish, then exit)."""
        with self._lock:
            threads = list(self._threads.values())
        for thread in threads:
            thread.join()


def _job(
    settings: Settings, scenario: str, job_id: str, config: str | None, overrides: dict[str, Any]
) -> None:
    try:
        log.info("%s: job %s", scenario, job_id)
        result = run_job(settings, scenario, job_id, config, overrides)
        log.info("%s: job %s %s", scenario, job_id, json.dumps(result, default=str)[:2000])
    except ReefError as e:
        log.error("%s: job %s failed: %s", scenario, job_id, e.message)
    except Exception:
        log.exception("%s: job %s failed", scenario, job_id)


def _evolve(
    settings: Settings,
    scenario: str,
    kind: str,
    config: str | None,
    overrides: dict[str, Any],
    submitted: dict[str, str],
) -> None:
    try:
        is_ready, eligible = ready(settings, scenario, kind)
        if not is_ready:
            return
        log.info("%s: %d eligible samples: evolving", scenario, eligible)
        result = run_once(settings, scenario, config, overrides)
        if result.get("status") in ("submitted", "in_flight"):  # ours, or another replica's
            submitted[scenario] = str(result["flow_run_id"])
        log.info("%s: evolve %s", scenario, json.dumps(result, default=str)[:2000])
        print(json.dumps({"scenario": scenario, **result}, default=str), flush=True)
    except ReefError as e:
        log.error("%s: evolve failed: %s", scenario, e.message)
    except Exception:
        log.exception("%s: evolve failed", scenario)


def _in_flight_safe(flow_run_id: str) -> bool:
    try:
        return in_flight(flow_run_id)
    except Exception as e:  # the Prefect server is unreachable: check again next time
        log.warning("reading flow run %s failed: %s", flow_run_id, e)
        return True


if __name__ == "__main__":
    sys.exit(main())
