"""What the Postgres fault rows need beyond the other rows' helpers: a private PostgreSQL
cluster the test may restart and stop (the machine's own server is shared and never touched),
and a client that calls and reports all along, noting what each call got and how long it took.

The cluster is initdb'd into a directory of its own with trust auth on a free loopback port.
PostgreSQL refuses to run as root, so as root (CI runs the tests so) its programs run as the
`postgres` user (runuser), with the directory owned by that user; /tmp is where it goes, since
a root test's tmp_path lies under a directory only root may enter."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import psycopg
import pytest

from reef.testing.process import free_port

PG_USER = "postgres"


def _bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if not found:
        pytest.skip("no PostgreSQL server programs (/usr/lib/postgresql/*/bin/initdb)")
    return Path(found[0]).parent


class PrivatePostgres:
    """A PostgreSQL cluster of the test's own: `start()`, `stop()`, `restart()`, each waiting
    until it is done (pg_ctl -w); `url` names its `reef` database."""

    def __init__(self) -> None:
        self.bin = _bin_dir()
        self.as_user: list[str] = []
        owner = None
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam(PG_USER)
            except KeyError:
                pytest.skip(f"running as root and no {PG_USER!r} user to run PostgreSQL as")
            self.as_user = ["runuser", "-u", PG_USER, "--"]
        self.root = Path(tempfile.mkdtemp(prefix="reef-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        if owner is not None:
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
        self.port = free_port()
        self.options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root}"
        self.url = f"postgresql+psycopg://{PG_USER}@127.0.0.1:{self.port}/reef"
        self.frozen: list[int] = []

    def _run(self, program: str, *args: str, timeout: float = 120) -> float:
        """Run one of the server's programs; the seconds it took."""
        started = time.monotonic()
        cmd = [*self.as_user, str(self.bin / program), *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            tail = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{program} {args}: {done.stdout}{done.stderr}\n{tail}")
        return time.monotonic() - started

    def _ctl(self, action: str, *args: str) -> float:
        return self._run("pg_ctl", action, "-w", "-D", str(self.data), "-l", str(self.log), *args)

    def init(self) -> PrivatePostgres:
        self._run("initdb", "-D", str(self.data), "-U", PG_USER, "--auth=trust", "-E", "UTF8")
        self.start()
        admin = f"postgresql://{PG_USER}@127.0.0.1:{self.port}/postgres"
        with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
            conn.execute("CREATE DATABASE reef")
        return self

    def start(self) -> float:
        return self._ctl("start", "-o", self.options)

    def stop(self) -> float:
        return self._ctl("stop", "-m", "fast")

    def restart(self) -> float:
        return self._ctl("restart", "-m", "fast", "-o", self.options)

    def processes(self) -> list[int]:
        """This cluster's processes: its postmaster (postmaster.pid's first line, checked to
        be serving this data directory) first, then the postmaster's children. Never another
        cluster's: the machine's own server is shared."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        cmdline = Path(f"/proc/{postmaster}/cmdline").read_bytes().split(b"\0")
        assert str(self.data).encode() in cmdline, f"pid {postmaster} is not this cluster's"
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()  # after the command's name
            except (OSError, IndexError):
                continue  # gone meanwhile
            if int(fields[1]) == postmaster:
                children.append(int(stat.parent.name))
        return [postmaster, *children]

    def freeze(self) -> int:
        """SIGSTOP every process of the cluster, the postmaster first (stopped, it forks no
        more): the kernel still completes connections and acknowledges what is sent on them,
        and nothing is ever answered. Returns how many processes were stopped."""
        postmaster, *_ = self.processes()
        os.kill(postmaster, signal.SIGSTOP)
        self.frozen = self.processes()  # the children as they are now it cannot fork
        for pid in self.frozen[1:]:
            os.kill(pid, signal.SIGSTOP)
        return len(self.frozen)

    def thaw(self) -> None:
        """SIGCONT what `freeze` stopped, the postmaster last."""
        for pid in reversed(self.frozen):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.frozen = []

    def close(self) -> None:
        self.thaw()  # a stopped server would not stop
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self._ctl("stop", "-m", "immediate")
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class Attempt:
    """One call or report: when it started (monotonic), what it was, its status (0: no
    answer), how long it took, the Retry-After it carried, the id it acknowledged."""

    at: float
    kind: str
    status: int
    seconds: float
    retry_after: str | None = None
    acked: str | None = None


@dataclass
class Caller:
    """A client calling (the openai SDK, no retries, each call bounded by `timeout_s`) and
    reporting each receipt (httpx, with `score`) every `every_s`, in its own thread, until
    `stop`. `model`: what the calls name (the echo upstream's, or the embedded engine's)."""

    base: str
    scenario: str = "default"
    model: str = "echo"
    score: float = 1.0
    every_s: float = 0.1
    timeout_s: float = 10.0
    attempts: list[Attempt] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Caller:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(2 * self.timeout_s + 5)

    def _run(self) -> None:
        headers = {"x-reef-scenario": self.scenario}
        with (
            openai.OpenAI(
                base_url=f"{self.base}/v1",
                api_key="none",
                max_retries=0,
                timeout=self.timeout_s,
                default_headers=headers,
            ) as client,
            httpx.Client(base_url=self.base, headers=headers, timeout=self.timeout_s) as http,
        ):
            while not self.stop.wait(self.every_s):
                receipt = self._call(client)
                if receipt:
                    self._report(http, receipt)

    def _call(self, client: openai.OpenAI) -> str | None:
        started = time.monotonic()
        status, retry, receipt = 0, None, None
        try:
            raw = client.chat.completions.with_raw_response.create(
                model=self.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            status, receipt = 200, raw.headers["x-reef-agent-record-id"]
        except openai.APIStatusError as e:
            status, retry = e.status_code, e.response.headers.get("retry-after")
        except openai.APIConnectionError:
            pass
        self.attempts.append(
            Attempt(started, "call", status, time.monotonic() - started, retry, receipt)
        )
        return receipt

    def _report(self, http: httpx.Client, receipt: str) -> None:
        started = time.monotonic()
        status, retry, acked = 0, None, None
        try:
            r = http.post("/reef/report", json={"references": [receipt], "score": self.score})
            status, retry = r.status_code, r.headers.get("retry-after")
            acked = r.json()["id"] if r.status_code in (200, 201) else None
        except httpx.HTTPError:
            pass
        self.attempts.append(
            Attempt(started, "report", status, time.monotonic() - started, retry, acked)
        )

    def acked(self, kind: str) -> list[str]:
        return [a.acked for a in self.attempts if a.kind == kind and a.acked]

    def between(self, start: float, end: float) -> list[Attempt]:
        return [a for a in self.attempts if start <= a.at and a.at + a.seconds <= end]

    def first_ok_after(self, t: float) -> float | None:
        """Seconds from `t` until a call that started after it was answered 200."""
        ends = [
            a.at + a.seconds
            for a in list(self.attempts)
            if a.kind == "call" and a.at >= t and a.status == 200
        ]
        return min(ends) - t if ends else None

    def summary(self, attempts: list[Attempt]) -> dict[str, Any]:
        statuses: dict[str, int] = {}
        for a in attempts:
            statuses[f"{a.kind} {a.status}"] = statuses.get(f"{a.kind} {a.status}", 0) + 1
        return {
            "answers": statuses,
            "slowest_s": round(max((a.seconds for a in attempts), default=0.0), 3),
            "retry_after": sorted({a.retry_after for a in attempts if a.status == 503}, key=str),
        }
