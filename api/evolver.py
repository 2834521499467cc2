"""The API side of the automatic trigger: a local evolve worker process (cli.worker) that
`reef serve` starts and tells about every report (reef.triggers, one JSON line each on its
stdin), so training never runs in the API process. A worker that dies (killed, out of memory)
is started again (`revive`, every few seconds), and the new one looks at every scenario: the
runs it lost redo what they had not finished (a batch is consumed only once its candidate is
decided)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from reef.settings import secret_environment, split_secrets
from reef.triggers import Trigger, encode

log = logging.getLogger("reef.api")

# A worker that dies within this long of its start waits before the next one, twice as long
# each time (up to REVIVE_MAX_S): one that cannot start is not restarted in a tight loop.
REVIVE_QUICK_S, REVIVE_MAX_S = 10.0, 300.0


class Evolver:
    """Starts `python -m reef.cli.worker` and writes a trigger to it per report or job; `stop()`
    closes its stdin, and the worker finishes the runs in progress and exits."""

    def __init__(
        self,
        config: Path | None,
        overrides: dict[str, Any],
        engine_token: str | None = None,
        state_dir: Path | None = None,
    ):
        self.state_dir = state_dir
        self.config = config
        self.overrides = overrides
        self.engine_token = engine_token
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()
        self._started_at = 0.0
        self._delay_s = 0.0  # before the next restart, after quick deaths
        self.restarts = 0

    def start(self) -> None:
        # Secret settings given as flags (--database-url may carry a password) go to the
        # worker in its environment, which only its user can read; any user can read argv.
        public, secret = split_secrets(self.overrides)
        cmd = [
            sys.executable,
            "-m",
            "reef.cli.worker",
            "--overrides",
            json.dumps(public, default=str),
        ]
        if self.config is not None:
            cmd += ["--config", str(self.config)]
        env = dict(os.environ)
        if self.state_dir is not None:
            # Without a Prefect server the worker runs Prefect's temporary server on a SQLite
            # file: its own one beside Reef's state, not ~/.prefect shared by every process.
            env.setdefault("PREFECT_HOME", str((self.state_dir / "prefect").resolve()))
        # On a busy 2-core machine the temporary server takes longer than Prefect's 20 s.
        env.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
        # A private, temporary server has nobody to send telemetry for (and its heartbeat
        # trips over SQLite's lock while the first flow starts).
        env.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        env.update(secret_environment(secret))
        if self.engine_token:
            env["REEF_REEF__ENGINE_TOKEN"] = self.engine_token
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, text=True, env=env)
        self._started_at = time.monotonic()
        log.info("evolve worker started (pid %d)", self._proc.pid)

    def revive(self) -> bool:
        """Start the worker again if it died (not stopped): True when it did. The new worker
        looks at every scenario as it starts (cli.worker), so a batch its predecessor was
        training is trained again without waiting for the next report."""
        with self._lock:
            proc = self._proc
            if proc is None or proc.poll() is None:
                return False
            lived = time.monotonic() - self._started_at
            if lived < REVIVE_QUICK_S:
                if lived < self._delay_s:
                    return False  # died quickly before: wait a while first
                self._delay_s = min(REVIVE_MAX_S, max(2.0, 2 * self._delay_s))
            else:
                self._delay_s = 0.0
            self.restarts += 1
            if proc.stdin is not None:
                with contextlib.suppress(OSError):  # the dead one's pipe
                    proc.stdin.close()
            log.warning(
                "evolve worker (pid %d) exited with code %s: starting it again (restart %d)",
                proc.pid,
                proc.returncode,
                self.restarts,
            )
            self.start()
        return True

    def exit_code(self) -> int | None:
        """None while the worker runs (or before it started); its exit code once it ended."""
        proc = self._proc
        return None if proc is None else proc.poll()

    def notify(self, scenario: str) -> bool:
        """A report arrived for `scenario` (or the dashboard asked): the worker checks whether a
        batch is ready. False when the worker is not running."""
        return self._send(Trigger.evolve(scenario))

    def run_job(self, scenario: str, job_id: str) -> bool:
        """Hand a user's job to the worker; False when the worker is not running."""
        return self._send(Trigger.job(scenario, job_id))

    def _send(self, trigger: Trigger) -> bool:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return False
        stdin: IO[str] | None = proc.stdin
        try:
            assert stdin is not None
            stdin.write(encode(trigger))
            stdin.flush()
        except (BrokenPipeError, OSError) as e:
            log.warning("evolve worker is gone: %s", e)
            return False
        return True

    def stop(self, timeout_s: float = 30.0) -> None:
        with self._lock:  # no revive from here on
            proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin:
                proc.stdin.close()  # EOF: the worker finishes what it runs and exits
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
