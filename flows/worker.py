"""The flows' entry points for a worker: evolve a scenario or run a user's job, here or as a
run of a Prefect deployment.

Without a Prefect server configured the flow runs in the calling process (Prefect's temporary
server starts once, at the first run); with PREFECT_API_URL pointing at a server it is submitted
as a run of the `evolve/evolve` (or `instruct/instruct`) deployment, and a Prefect worker of the
deployment's work pool runs it. The local evolve worker `reef serve` starts (cli.worker), the
`reef evolve` command and the tests all call these."""

from __future__ import annotations

import gc
import logging
import os
from pathlib import Path
from typing import Any

from reef.settings import Settings, conceal, secret_names, split_secrets

log = logging.getLogger("reef.worker")

DEPLOYMENT = "evolve/evolve"
INSTRUCT_DEPLOYMENT = "instruct/instruct"


def prefect_server() -> str | None:
    """The Prefect API this process talks to, when one is configured (Prefect's setting)."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def ready(settings: Settings, scenario: str) -> tuple[bool, int]:
    """Whether `scenario` has a batch ready for its recipe (its own settings: the
    configuration's and the run-time ones), and how many eligible samples it has. Never
    ready when its recipe cannot evolve on this engine (a weights recipe behind upstream)."""
    from reef.readiness import scenario_readiness
    from reef.recipe import evolves_with
    from reef.scenario_settings import learning_settings
    from reef.store.sql import open_store

    store = open_store(settings.database_url)
    try:
        recipe = learning_settings(settings, store, scenario).reef.recipe
        if not evolves_with(settings.engine.kind, recipe):
            return False, 0
        r = scenario_readiness(store, scenario, settings, judge=False)
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
    from reef.flows.evolve import evolve

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
    from reef.flows.instruct import instruct

    return instruct(scenario, job_id, config=config, overrides=conceal(overrides))


def preload() -> None:
    """Import what the first evolve run needs (~30 s of imports on 2 busy cores) while
    Prefect's server starts, instead of after the first batch is ready."""
    import great_expectations  # noqa: F401
    import mlflow  # noqa: F401
    import peft  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import trl  # noqa: F401

    # What these imports loaded lives as long as the process: move it out of the collector's
    # sight, as the API process does (api.services). Measured: accelerate runs gc.collect() at
    # the end of every training, and each full collection scanned ~775k objects for ~1.2 s.
    gc.collect()
    gc.freeze()


def trim_memory() -> tuple[int, int] | None:
    """Hand the heap that ended runs freed back to the system: (RSS before, RSS after) in
    bytes, or None where it cannot be done (not Linux with glibc).

    Why: each run trains in a thread of its own, and glibc gives each thread's allocations an
    arena of their own that keeps what was freed in it: read from /proc/<pid>/smaps of a soak's
    worker idle between rounds, 1.9 GiB of its 3.4 GiB RSS sat in 45 such arenas. `malloc_trim`
    releases the free pages of every arena (madvise), without moving anything in use."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    before = _rss()
    trim(0)
    return before, _rss()


def _rss() -> int:
    """This process's resident set size in bytes (0 where /proc does not tell)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def warmup() -> None:
    """Start Prefect's temporary server now (~14 s) with a flow that does nothing, rather
    than at the first evolve run; one that dies with this process (`tie_temporary_server`)."""
    from prefect import flow

    tie_temporary_server()

    @flow(name="reef-worker-warmup")
    def warmup() -> None:
        return None

    warmup()


# Runs first in the temporary server's process, then becomes it (execv): it asks the kernel to
# SIGKILL it when its parent dies (prctl PR_SET_PDEATHSIG = 1; kept across the exec), and exits
# if the parent died before it asked. A killed worker's server would otherwise live on.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(1)\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])\n"
)


def tie_temporary_server() -> None:
    """Make the temporary server Prefect starts for this process (no PREFECT_API_URL) die with
    it, on Linux: Prefect's own stops it at exit only, so a SIGKILLed worker (the OOM killer,
    a fault test) left it serving, orphaned, for good. Prefect looks its temporary server up
    as a singleton (`SubprocessASGIServer()`): registered first, this subclass is the one it
    starts. Call it from the main thread, before any flow runs: the kernel's parent-death
    signal follows the thread that started the child, so a server started from another thread
    (a run's, if this one's start failed) is started as Prefect does, untied."""
    import sys
    import threading

    from prefect.server.api.server import SubprocessASGIServer

    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return
    if None not in SubprocessASGIServer._instances:  # not made yet (nor started)
        _tied_server_class()()  # registers itself as the temporary server


def _tied_server_class() -> type[Any]:
    """Prefect's temporary server, started through `_DIE_WITH_PARENT` (a class made on first
    use: prefect is imported lazily)."""
    import subprocess
    import sys
    import threading

    import prefect
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import get_current_settings

    class TiedServer(SubprocessASGIServer):
        def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
            if threading.current_thread() is not threading.main_thread():
                return super()._run_uvicorn_command()
            # As prefect 3's SubprocessASGIServer._run_uvicorn_command, behind the launcher.
            uvicorn = [
                *("-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent)),
                *("--factory", "prefect.server.api.server:create_app"),
                *("--host", "127.0.0.1", "--port", str(self.port)),
                *("--log-level", "error", "--lifespan", "on"),
            ]
            env = {
                **os.environ,
                "PREFECT_UI_ENABLED": "0",
                "PREFECT__SERVER_EPHEMERAL": "1",
                "PREFECT__SERVER_FINAL": "1",
                **get_current_settings().to_environment_variables(exclude_unset=True),
            }
            launcher = [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid())]
            return subprocess.Popen([*launcher, *uvicorn], env=env)

    return TiedServer


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
