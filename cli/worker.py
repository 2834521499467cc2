"""The local evolve worker: the program `reef serve` starts beside the API (api.evolver), so
training never runs in the API process.

It reads triggers on stdin (reef.triggers: one JSON object a line; the API writes one per
report and per user's job) and composes background tasks (reef.background):

- the dispatcher: for each scenario a trigger names, whose eligible samples reach
  `batch_size`, it starts the evolve flow; each user's job (POST /reef/train) starts the
  instruct flow (flows.worker: in this process, or as a Prefect deployment run);
- the schedule, with `reef.schedule_s`: every scenario on that interval, and what dead or
  failed runs left (ReleaseChain.recover: pending candidates, the MLflow alias);
- the judge, when judging is on (flows.judging): it judges new turns and triggers the
  scenarios that got judgments;
- retention, with `store.retention_days`: old records and reports archived every hour.

Each run has a thread of its own, one per scenario (or job) at a time: a run that waits, such
as a manual gate's candidate waiting for approval, never holds up another scenario's evolve
run or a user's job. A scenario triggered while its run is in progress is looked at again when
that run ends. At the end of stdin (the API process is gone) the worker stops its tasks,
finishes the runs in progress and exits.

    python -m reef.cli.worker [--config cfg.yaml] [--overrides JSON]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reef import logs
from reef.background import BackgroundTask
from reef.errors import ReefError
from reef.flows.worker import (
    in_flight,
    prefect_server,
    preload,
    ready,
    run_job,
    run_once,
    trim_memory,
    warmup,
)
from reef.settings import Settings, load_settings
from reef.triggers import Trigger, parse

log = logging.getLogger("reef.worker")

# How often retention runs here: rows cross the window continuously, an hour late is nothing
# next to a window of days, and each run walks only the rows past the cutoff.
RETENTION_EVERY_S = 3600.0


class Outage:
    """The store (or another dependency) away while a task keeps ticking: one warning when it
    goes, one line when it is back, and nothing in between (a traceback every schedule tick
    while Postgres restarts buries what else the log says). Ticks may come from several
    threads."""

    def __init__(self, what: str):
        self.what = what
        self._since: float | None = None
        self._lock = threading.Lock()

    def failed(self, error: ReefError) -> None:
        with self._lock:
            first, self._since = self._since is None, self._since or time.monotonic()
        if first:
            log.warning("%s unavailable, tried again each tick: %s", self.what, error.message)
        else:
            log.debug("%s still unavailable: %s", self.what, error.message)

    def ok(self) -> None:
        with self._lock:
            since, self._since = self._since, None
        if since is not None:
            log.info("%s back after %.0f s", self.what, time.monotonic() - since)


class Worker:
    """The worker's parts: its runs, the triggers waiting for the dispatcher, and the
    background tasks; `start()` and `stop()` them together."""

    def __init__(self, settings: Settings, config: str | None, overrides: dict[str, Any]):
        self.settings = settings
        self.config = config
        self.overrides = overrides
        self.runs = Runs()
        self.inbox: queue.SimpleQueue[Trigger] = queue.SimpleQueue()
        # scenario -> its deployment run still owning a batch (written by the run threads)
        self.submitted: dict[str, str] = {}
        self.store_outage = Outage("the store (scanning scenarios)")
        self._preload = threading.Thread(target=preload, name="reef-worker-preload", daemon=True)
        self.dispatcher = BackgroundTask("worker-dispatch", self.dispatch)
        self.tasks = [self.dispatcher]
        if settings.reef.schedule_s is not None:
            scan = BackgroundTask(
                "worker-schedule",
                lambda: self.notify(Trigger.scan()),
                every_s=settings.reef.schedule_s,
            )
            self.tasks.append(scan)
        self.tasks += [t for t in (judging(settings, self.notify), retention(settings)) if t]

    def notify(self, trigger: Trigger) -> None:
        """Hand a trigger to the dispatcher."""
        self.inbox.put(trigger)
        self.dispatcher.trigger()

    def start(self) -> None:
        self._preload.start()
        if not prefect_server():
            # Prefect's temporary server takes ~14 s to start: pay it now, not after a report.
            try:
                warmup()
            except Exception as e:  # the first evolve run tries again
                log.warning("warming up Prefect failed: %s", e)
        self.recover()  # any scenario may have candidates: each has its own recipe
        log.info(
            "evolve worker ready (recipe %s, batch %d)",
            self.settings.reef.recipe,
            self.settings.reef.batch_size,
        )
        for task in self.tasks:
            task.start()
        # Every scenario looked at once: a batch left ready while no worker ran, or by a run
        # that died with the API process (killed mid-deploy), is trained without waiting for
        # the scenario's next report.
        self.notify(Trigger.scan())

    def recover(self) -> None:
        """What runs of a worker that died left (deploy.chain.ReleaseChain.recover), for every
        scenario: a candidate whose head swap went through is finished even when no new batch
        will run for its scenario."""
        from reef.flows.release import recover

        try:
            scenarios = self._scenarios()
        except Exception as e:  # the database is away: the next run recovers its scenario
            log.warning("recovering candidates on start failed: %s", e)
            return
        for scenario in sorted(scenarios):
            recover(self.settings, scenario)

    def stop(self) -> None:
        """Stop the tasks (the triggers still waiting are dropped), then wait for the runs in
        progress."""
        for task in reversed(self.tasks):
            task.stop()
        self.runs.join()

    def dispatch(self) -> None:
        """Start a run for each waiting trigger: users' jobs at once, and an evolve run per
        scenario (a burst of reports is one check) whose batch is ready."""
        triggers: set[Trigger] = set()
        while True:
            try:
                triggers.add(self.inbox.get_nowait())
            except queue.Empty:
                break
        for job in sorted((t for t in triggers if t.kind == "job"), key=lambda t: str(t.job_id)):
            assert job.scenario is not None and job.job_id is not None
            # users wait on these: each starts at once, beside any evolve run
            self.runs.start(f"job {job.job_id}", self._job, job.scenario, job.job_id)
        # Evolve runs import trl's trainers in their own threads; a thread resolving its lazy
        # module while the preload does can fail with "cannot import name 'SFTConfig' from
        # 'trl'". They start once the preload is done (users' jobs need no trainer).
        self._preload.join()
        names = {t.scenario for t in triggers if t.kind == "evolve" and t.scenario}
        scanned = any(t.kind == "scan" for t in triggers)
        if scanned:
            try:
                names = self._scenarios()
            except ReefError as e:  # the next tick scans again
                self.store_outage.failed(e)
                return
            self.store_outage.ok()
        for scenario in sorted(names):
            key = f"evolve {scenario}"
            if self.runs.running(key):
                # looked at again when this run ends: the batch it trains is not this one
                self.runs.again(key, functools.partial(self.notify, Trigger.evolve(scenario)))
                continue
            if scenario in self.submitted and _in_flight_safe(self.submitted[scenario]):
                continue
            self.runs.start(key, self._evolve, scenario, scanned)

    def _scenarios(self) -> set[str]:
        from reef.store.sql import open_store

        store = open_store(self.settings.database_url)
        try:
            return {s.name for s in store.list_scenarios()}
        finally:
            store.close()

    def _job(self, scenario: str, job_id: str) -> None:
        logs.SCENARIO.set(scenario)  # this run's thread: its lines name the scenario
        try:
            log.info("%s: job %s", scenario, job_id)
            result = run_job(self.settings, scenario, job_id, self.config, self.overrides)
            log.info("%s: job %s %s", scenario, job_id, json.dumps(result, default=str)[:2000])
        except ReefError as e:
            log.error("%s: job %s failed: %s", scenario, job_id, e.message)
        except Exception:
            log.exception("%s: job %s failed", scenario, job_id)
        _give_back_memory(scenario)

    def _evolve(self, scenario: str, scanned: bool = False) -> None:
        """An evolve run of `scenario` if its batch is ready. `scanned` (the schedule): if it
        is not, what runs left unfinished is finished instead (deploy.chain recover: the MLflow
        alias of a publish whose MLflow was away), which no run would do until a new batch;
        here, in the scenario's own thread, never beside a run of it."""
        logs.SCENARIO.set(scenario)  # this run's thread: its lines name the scenario
        ran = False
        try:
            # (never ready where the scenario's recipe cannot evolve on this engine: a weights
            # recipe behind an upstream engine has nothing to train; users' jobs still run)
            is_ready, eligible = ready(self.settings, scenario)
            if not is_ready:
                if scanned:
                    from reef.flows.release import recover

                    recover(self.settings, scenario)
                return
            log.info("%s: %d eligible samples: evolving", scenario, eligible)
            ran = True
            result = run_once(self.settings, scenario, self.config, self.overrides)
            if result.get("status") in ("submitted", "in_flight"):  # ours, or another replica's
                self.submitted[scenario] = str(result["flow_run_id"])
            log.info("%s: evolve %s", scenario, json.dumps(result, default=str)[:2000])
            print(json.dumps({"scenario": scenario, **result}, default=str), flush=True)
        except ReefError as e:
            log.error("%s: evolve failed: %s", scenario, e.message)
        except Exception:
            log.exception("%s: evolve failed", scenario)
        if ran:
            _give_back_memory(scenario)


def judging(settings: Settings, notify: Callable[[Trigger], None]) -> BackgroundTask | None:
    """When judging is on (flows.judging), a task that judges the new turns of every scenario
    every `judge.poll_s` and triggers each scenario that got judgments."""
    from reef.flows.judging import Judging, judging_enabled
    from reef.scenario_settings import learning_settings

    if not judging_enabled(settings):
        return None
    from reef.store.sql import open_store

    judge = Judging(settings, open_store(settings.database_url))
    outage = Outage("the store (judging)")

    def step() -> None:
        try:
            # the scenarios whose own settings learn from judgments (scenarios.<name>)
            names = [
                s.name
                for s in judge.store.list_scenarios()
                if judging_enabled(learning_settings(settings, judge.store, s.name), s.name)
            ]
            judged = judge.run_pass(names)
        except ReefError as e:  # the next pass judges what this one could not
            outage.failed(e)
            return
        outage.ok()
        for scenario in sorted(judged):
            notify(Trigger.evolve(scenario))

    log.info("judging next turns and text-only reports every %.1f s", settings.judge.poll_s)
    return BackgroundTask(
        "worker-judging", step, every_s=settings.judge.poll_s, now=True, last=judge.close
    )


def retention(settings: Settings) -> BackgroundTask | None:
    """With `store.retention_days`, a task that archives and deletes old rows every
    RETENTION_EVERY_S (reef.retention); a failed run is logged and tried again then."""
    if settings.store.retention_days is None:
        return None
    from reef.artifacts import artifacts_for
    from reef.retention import apply_retention
    from reef.store.sql import open_store

    store = open_store(settings.database_url)
    artifacts = artifacts_for(settings)

    def step() -> None:
        try:
            apply_retention(store, settings, artifacts)
        except ReefError as e:
            log.warning("retention failed, retried in %.0f s: %s", RETENTION_EVERY_S, e)

    log.info("archiving records older than %s days every hour", settings.store.retention_days)
    return BackgroundTask(
        "worker-retention", step, every_s=RETENTION_EVERY_S, now=True, last=store.close
    )


def _give_back_memory(scenario: str) -> None:
    """After a run: what its thread's allocations freed back to the system (trim_memory), and
    the worker's RSS before and after, logged."""
    rss = trim_memory()
    if rss is not None and rss[0]:
        mib = 1 << 20
        log.info(
            "%s: worker RSS %d -> %d MiB (freed heap returned)",
            scenario,
            rss[0] // mib,
            rss[1] // mib,
        )


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

    def start(self, key: str, target: Callable[..., None], *args: Any) -> bool:
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


# reef.worker_priority -> the nice increment it adds (idle adds SCHED_IDLE on Linux)
NICE = {"idle": 19, "low": 10, "normal": 0}


def yield_cores(priority: str) -> None:
    """Lower this process's CPU priority before any thread or child starts (each inherits
    it), and that of the threads already running: on the serving machine the worker's
    start-up (~30 s of torch, TRL, MLflow and GX imports), Prefect's temporary server and its
    training then run on what the serving engine leaves, rather than slowing the answers of
    the first minute after every start. Measured (bench/after_start.py): at nice +10 the
    engine still lost a tenth of its speed in that minute (the worker's time slices stall its
    threads); SCHED_IDLE tasks run only when a core has nothing else to run. Raising it back
    would need privileges: the worker stays there, which is what a serving machine wants of
    its training too (an idle engine leaves it every core)."""
    nice = NICE[priority]
    if nice == 0:
        return
    try:
        now = os.nice(nice)
    except OSError as e:  # a platform or sandbox that refuses: run at the server's priority
        log.warning("could not lower the worker's CPU priority (%s): %s", priority, e)
        return
    idle = priority == "idle" and hasattr(os, "SCHED_IDLE")
    if sys.platform == "linux":  # priority is per thread there: each running thread too
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.setpriority(os.PRIO_PROCESS, int(task), now)
                if idle:
                    os.sched_setscheduler(int(task), os.SCHED_IDLE, os.sched_param(0))
    log.info("worker CPU priority: %s (nice %d%s)", priority, now, ", SCHED_IDLE" if idle else "")


def _in_flight_safe(flow_run_id: str) -> bool:
    try:
        return in_flight(flow_run_id)
    except Exception as e:  # the Prefect server is unreachable: check again next time
        log.warning("reading flow run %s failed: %s", flow_run_id, e)
        return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m reef.cli.worker", description=__doc__)
    p.add_argument("--config", help="YAML settings file (as given to reef serve)")
    p.add_argument("--overrides", default="{}", help="settings from CLI flags, as JSON")
    args = p.parse_args(argv)
    overrides = json.loads(args.overrides)
    settings = load_settings(Path(args.config) if args.config else None, **overrides)
    logs.quiet_progress_bars()
    logs.configure(settings.server.log_level, settings.server.log_format, process="worker")
    yield_cores(settings.reef.worker_priority)
    # Great Expectations logs ~40 INFO lines per validation about its own plugins.
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    worker = Worker(settings, args.config, overrides)
    worker.start()
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                worker.notify(parse(line))
            except ReefError as e:  # one bad line is no reason to stop evolving
                log.warning("ignoring a line on stdin: %s", e.message)
    finally:
        worker.stop()  # the API process is gone: finish the runs in progress, then exit
    return 0


if __name__ == "__main__":
    sys.exit(main())
