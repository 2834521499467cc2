"""A serving fleet on one machine, for the multi-process test and bench/replicas.py: N `reef serve`
processes (the tiny model, an embedded engine each) sharing one Postgres database, registered in
its engine registry and sharing one admin token, plus a bounded load generator spread across
them (chat calls, each receipt reported through another replica)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from reef.testing.process import ReefServer, free_port, wait_ready

TOKEN = "reef-fleet-admin-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
MLFLOW = str(Path(sys.executable).with_name("mlflow"))


def fleet_config(extra: dict[str, Any]) -> dict[str, Any]:
    """The settings every replica (and the pool worker) reads: registry on with a short
    heartbeat, one admin token (auth.tokens, reef.engine_token comes from the environment)."""
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    config: dict[str, Any] = {
        "engine": {
            "model": "tiny",
            "fleet": {"registry": True, "heartbeat_s": 1.0, "registry_ttl_s": 5.0},
        },
        "auth": {"tokens": [{"name": "ops", "sha256": digest, "admin": True}]},
        "reef": {"auto": False},
    }
    for section, values in extra.items():
        config[section] = {**config.get(section, {}), **values}
    return config


class Fleet:
    """`n` replicas, each `reef serve -c <root>/fleet.yaml` on a port of its own (kept across a
    restart, so a restarted replica registers the same admin URL)."""

    def __init__(self, root: Path, n: int, config: dict[str, Any], env: dict[str, str]):
        self.root = root
        self.config_path = root / "fleet.yaml"
        root.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.env = {"REEF_REEF__ENGINE_TOKEN": TOKEN, **env}
        self.replicas = [self._replica(i, free_port()) for i in range(n)]

    def _replica(self, i: int, port: int) -> ReefServer:
        env: dict[str, str | None] = {**self.env}
        return ReefServer(
            self.root / f"replica-{i}", "-c", str(self.config_path), port=port, env=env
        )

    def start(self) -> Fleet:
        with ThreadPoolExecutor(max_workers=len(self.replicas)) as pool:
            list(pool.map(lambda r: r.start(timeout_s=240), self.replicas))
        return self

    def restart(self, i: int) -> float:
        """Start replica `i` again on its port; seconds until it answers /readyz."""
        old = self.replicas[i]
        self.replicas[i] = self._replica(i, old.port)
        started = time.monotonic()
        self.replicas[i].start(timeout_s=240)
        return time.monotonic() - started

    def stop(self) -> None:
        for r in self.replicas:
            r.stop()

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]


def served_release(url: str, scenario: str) -> str | None:
    """The release a replica serves `scenario` on now (None while it cannot answer)."""
    try:
        r = httpx.post(
            f"{url}/v1/chat/completions",
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 1,
            },
            headers={"x-reef-scenario": scenario, **AUTH},
            timeout=30,
        )
    except httpx.HTTPError:
        return None
    return r.headers.get("x-reef-release-id") if r.status_code == 200 else None


def until_served(urls: list[str], scenario: str, release_id: str, bound_s: float) -> float:
    """Seconds until every replica serves `release_id`; AssertionError past `bound_s`, naming
    what each replica serves."""
    started = time.monotonic()
    waiting = set(urls)
    seen: dict[str, str | None] = {}
    while waiting:
        for url in sorted(waiting):
            seen[url] = served_release(url, scenario)
            if seen[url] == release_id:
                waiting.discard(url)
        elapsed = time.monotonic() - started
        if waiting and elapsed > bound_s:
            raise AssertionError(
                f"after {elapsed:.1f}s, replicas still serve {[seen[u] for u in waiting]} "
                f"instead of {release_id}"
            )
        if waiting:
            time.sleep(0.1)
    return time.monotonic() - started


@dataclass
class Load:
    """What a load run saw: receipts acknowledged (200 with a record id), per replica index, and
    what failed (a dead replica's connection errors are expected; anything else is a bug)."""

    receipts: dict[int, list[str]] = field(default_factory=dict)
    reported: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    dropped: int = 0
    seconds: float = 0.0

    @property
    def all_receipts(self) -> list[str]:
        return [rid for got in self.receipts.values() for rid in got]


class LoadGenerator:
    """`threads` clients, client k calling replica k mod n; each call's receipt is reported
    (score 1 and a correction, what the sft recipe trains on) through the next replica. Bounded:
    it stops after `requests` calls in all, or at `stop()`, or after `duration_s`."""

    def __init__(
        self,
        urls: list[str],
        scenario: str,
        *,
        threads: int = 6,
        requests: int | None = None,
        duration_s: float | None = None,
        report: bool = True,
    ):
        self.urls = urls
        self.scenario = scenario
        self.threads = threads
        self.requests = requests
        self.duration_s = duration_s
        self.report = report
        self.load = Load(receipts={i: [] for i in range(len(urls))})
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._issued = 0
        self._workers: list[threading.Thread] = []

    def _take(self) -> int | None:
        with self._lock:
            if self._stop.is_set() or (self.requests is not None and self._issued >= self.requests):
                return None
            self._issued += 1
            return self._issued

    def _client(self, k: int) -> None:
        n = len(self.urls)
        headers = {"x-reef-scenario": self.scenario, **AUTH}
        with httpx.Client(headers=headers, timeout=60) as http:
            while (i := self._take()) is not None:
                at = (k + i) % n
                body = {
                    "model": "tiny",
                    "messages": [{"role": "user", "content": f"question {i}"}],
                    "max_tokens": 2,
                }
                try:
                    r = http.post(f"{self.urls[at]}/v1/chat/completions", json=body)
                except httpx.HTTPError:
                    with self._lock:
                        self.load.dropped += 1  # no answer, no receipt: nothing was promised
                    time.sleep(0.05)
                    continue
                if r.status_code != 200:
                    self._refused(f"{self.urls[at]} chat {r.status_code}: {r.text[:300]}")
                    continue
                rid = r.headers["x-reef-agent-record-id"]
                with self._lock:
                    self.load.receipts[at].append(rid)
                if self.report:
                    self._report(http, (at + 1) % n, rid, i)

    def _report(self, http: httpx.Client, at: int, rid: str, i: int) -> None:
        body = {"references": [rid], "score": 1.0, "feedback": {"correction": f"answer {i}"}}
        for attempt in range(len(self.urls)):  # another replica when this one is down
            url = self.urls[(at + attempt) % len(self.urls)]
            try:
                r = http.post(f"{url}/reef/report", json=body)
            except httpx.HTTPError:
                continue
            if r.status_code == 201:
                with self._lock:
                    self.load.reported.append(rid)
            else:
                self._refused(f"{url} report {r.status_code}: {r.text[:300]}")
            return

    def _refused(self, what: str) -> None:
        with self._lock:
            self.load.refused.append(what)

    def start(self) -> LoadGenerator:
        self._started = time.monotonic()
        self._workers = [
            threading.Thread(target=self._client, args=(k,), daemon=True)
            for k in range(self.threads)
        ]
        for w in self._workers:
            w.start()
        if self.duration_s is not None:
            timer = threading.Timer(self.duration_s, self._stop.set)
            timer.daemon = True
            timer.start()
        return self

    def wait_for(self, receipts: int, timeout_s: float = 120) -> None:
        """Return once `receipts` calls were acknowledged (or the load ended)."""
        deadline = time.monotonic() + timeout_s
        while len(self.load.all_receipts) < receipts and time.monotonic() < deadline:
            if not any(w.is_alive() for w in self._workers):
                return
            time.sleep(0.02)

    def stop(self) -> Load:
        self._stop.set()
        return self.join()

    def join(self) -> Load:
        for w in self._workers:
            w.join(timeout=120)
        self.load.seconds = time.monotonic() - self._started
        return self.load

    def __enter__(self) -> LoadGenerator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class MLflowServer:
    """`mlflow server` on a SQLite file, on loopback (artifacts go where each experiment's
    location says: Reef creates its experiments on the artifact store, S3 here).

    Without its job runner, as deploy/compose runs it: Reef submits no MLflow jobs, and the
    runner is seven more `huey_consumer` processes, each importing mlflow, starting at once with
    the server. On 2 cores, beside three replicas and a Prefect deploy starting too, that kept
    the server from answering within 180 s in a CI run."""

    def __init__(self, root: Path):
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> MLflowServer:
        self.root.mkdir(parents=True, exist_ok=True)
        log = (self.root / "mlflow.log").open("wb")
        args = ["server", "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}"]
        args += ["--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self.proc = subprocess.Popen(
            [MLFLOW, *args], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        proc = self.proc

        def tail() -> str:
            return (self.root / "mlflow.log").read_text(errors="replace")[-3000:]

        def gone() -> str | None:
            return None if proc.poll() is None else f"mlflow server exited:\n{tail()}"

        try:
            wait_ready(f"{self.url}/health", 180, gone)
        except TimeoutError as e:
            raise TimeoutError(f"{e}; its log:\n{tail()}") from None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # its server workers too
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
