"""MLflow clients per tracking URI, experiments, registered models and the S3 endpoint.

Every function takes the tracking URI (and optionally a registry URI, by default the same)
explicitly and uses its own `MlflowClient`, never MLflow's process-global tracking URI or active
run. MLflow is imported inside the functions: it takes seconds to import, and reef/ is also
imported by the API process.

Concurrency: the first opening of a new SQLite store is serialised across processes with a lock
file next to it (``<db>.reef-lock``), since MLflow's own table creation breaks when two processes
do it at once (see `_set_up_stores`); creating an experiment or registered model that another
process just created is not an error here.

S3: MLflow's S3 artifact repository takes its endpoint only from the environment variable
``MLFLOW_S3_ENDPOINT_URL`` (there is no per-call or per-client parameter in MLflow 3.17). Functions
that move artifacts take ``s3_endpoint_url`` and set that variable only for the duration of the
MLflow calls that upload or download (`s3_endpoint`); concurrent callers with the same endpoint
share the setting, a caller with another endpoint waits until they are done, and the previous value
is restored afterwards. With ``s3_endpoint_url=None`` nothing is touched (AWS, or whatever the
process environment says). Credentials come from boto3's usual chain.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger(__name__)


def mlflow_client(tracking_uri: str, registry_uri: str | None = None) -> Any:
    """An `MlflowClient` on these URIs (the registry's defaults to the tracking one), its stores
    set up once per process."""
    from mlflow import MlflowClient

    registry_uri = registry_uri or tracking_uri
    if (tracking_uri, registry_uri) not in _ready_stores:
        _set_up_stores(tracking_uri, registry_uri)
    return MlflowClient(tracking_uri=tracking_uri, registry_uri=registry_uri)


# Stores this process has opened once (their tables exist): a memo, so the set-up below runs
# once per store and process.
_ready_stores: set[tuple[str, str]] = set()
_ready_lock = threading.Lock()
_DB_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
STORE_SETUP_TIMEOUT_S = 120.0


def _set_up_stores(tracking_uri: str, registry_uri: str) -> None:
    """Open the stores once, serialised against other processes opening the same new database.

    MLflow creates and migrates its tables when a process first opens a database store. Two
    processes doing that at once on a new database make one of them fail ("table ... already
    exists") and can leave the schema half-migrated for good. For SQLite an exclusive lock on a
    file next to the database serialises the first opening across processes; for a database
    server (where Reef cannot take that lock) a failed opening is retried until the other process
    is done (creating the database once up front, e.g. `mlflow db upgrade`, avoids the race).
    """
    from contextlib import ExitStack

    from mlflow import MlflowClient

    with _ready_lock, ExitStack() as stack:
        if (tracking_uri, registry_uri) in _ready_stores:
            return
        for uri in dict.fromkeys((tracking_uri, registry_uri)):
            stack.enter_context(_sqlite_setup_lock(uri))
        deadline = time.monotonic() + STORE_SETUP_TIMEOUT_S
        delay = 0.2
        while True:
            try:
                client = MlflowClient(tracking_uri=tracking_uri, registry_uri=registry_uri)
                client.search_registered_models(max_results=1)  # the registry store opens lazily
                break
            except Exception as e:
                if not tracking_uri.startswith(_DB_SCHEMES) or time.monotonic() > deadline:
                    raise
                log.info(
                    "MLflow store %s is being set up elsewhere (%s); retrying", tracking_uri, e
                )
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
        _ready_stores.add((tracking_uri, registry_uri))


@contextmanager
def _sqlite_setup_lock(uri: str) -> Iterator[None]:
    """An exclusive lock on ``<database>.reef-lock`` for a sqlite:/// URI; nothing otherwise."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    import fcntl

    db = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{db}.reef-lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _error_code(e: Exception) -> str | None:
    return getattr(e, "error_code", None)


def already_exists(e: Exception) -> bool:
    """Whether an MlflowException says the thing to create exists already."""
    return _error_code(e) in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS")


def does_not_exist(e: Exception) -> bool:
    """Whether an MlflowException says the thing asked for does not exist."""
    return _error_code(e) in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND")


def ensure_experiment(tracking_uri: str, name: str, artifact_location: str | None = None) -> str:
    """The id of experiment `name`, created with `artifact_location` (settings'
    `mlflow_artifact_location`) when missing. An existing experiment keeps its location: MLflow
    cannot move one. Safe against another process creating it at the same time."""
    from mlflow.exceptions import MlflowException

    client = mlflow_client(tracking_uri)
    found = client.get_experiment_by_name(name)
    if found is not None:
        if artifact_location and found.artifact_location.rstrip("/") != artifact_location.rstrip(
            "/"
        ):
            log.info(
                "experiment %s keeps its artifact location %s (asked for %s)",
                name,
                found.artifact_location,
                artifact_location,
            )
        return str(found.experiment_id)
    try:  # (creating an experiment writes no artifact, on S3 or elsewhere)
        return str(client.create_experiment(name, artifact_location=artifact_location))
    except MlflowException as e:
        if not already_exists(e):
            raise
    found = client.get_experiment_by_name(name)
    if found is None:  # created and deleted in between: nothing sensible to do but fail
        raise RuntimeError(f"experiment '{name}' vanished while being created")
    return str(found.experiment_id)


def ensure_registered_model(client: Any, name: str) -> None:
    """Create registered model `name` unless it exists (another process may just have made it)."""
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(
            name, description="Reef release chain (mirror; the chain's CAS is Reef's database)"
        )
    except MlflowException as e:
        if not already_exists(e):  # another process registered it first: fine
            raise


class EnvOverride:
    """One environment variable set while any user holds it, shared by users that want the same
    value; a user wanting another value waits. The previous value comes back at the end."""

    def __init__(self, name: str):
        self.name = name
        self._cond = threading.Condition()
        self._users = 0
        self._saved: str | None = None

    @contextmanager
    def __call__(self, value: str | None) -> Iterator[None]:
        if value is None:
            yield
            return
        with self._cond:
            while self._users and os.environ.get(self.name) != value:
                self._cond.wait()
            if self._users == 0:
                self._saved = os.environ.get(self.name)
                os.environ[self.name] = value
            self._users += 1
        try:
            yield
        finally:
            with self._cond:
                self._users -= 1
                if self._users == 0:
                    if self._saved is None:
                        os.environ.pop(self.name, None)
                    else:
                        os.environ[self.name] = self._saved
                    self._cond.notify_all()


_HTTP_TIMEOUT = "MLFLOW_HTTP_REQUEST_TIMEOUT"
_HTTP_RETRIES = "MLFLOW_HTTP_REQUEST_MAX_RETRIES"


def bound_http_requests(timeout_s: int, retries: int) -> Callable[[], None]:
    """Hold this process's MLflow HTTP requests to `timeout_s` each and `retries` retries
    (tracking.http_timeout_s, tracking.http_retries). MLflow reads MLFLOW_HTTP_REQUEST_TIMEOUT
    and MLFLOW_HTTP_REQUEST_MAX_RETRIES at every request; its defaults (120 s, 7 retries with
    exponential backoff) held a request minutes on an unreachable server. A variable already
    in the environment is the operator's and stays. Returns the undo."""
    wanted = {_HTTP_TIMEOUT: str(timeout_s), _HTTP_RETRIES: str(retries)}
    set_here = {name: value for name, value in wanted.items() if name not in os.environ}
    os.environ.update(set_here)

    def undo() -> None:
        for name, value in set_here.items():
            if os.environ.get(name) == value:
                del os.environ[name]

    return undo


def ping_tracking(tracking_uri: str, timeout_s: float) -> bool:
    """Raise OSError unless the tracking store answers (readiness: no MLflow import, no side
    effects): an MLflow server's /health, a database server's port, a local store's directory.
    False: a kind of store this cannot check (databricks, ...)."""
    scheme = tracking_uri.split(":", 1)[0].split("+", 1)[0].lower() if "://" in tracking_uri else ""
    if scheme in ("http", "https"):
        import httpx

        try:
            answer = httpx.get(tracking_uri.rstrip("/") + "/health", timeout=timeout_s)
        except httpx.HTTPError as e:
            raise OSError(f"no answer ({type(e).__name__})") from None
        if answer.status_code != 200:
            raise OSError(f"/health answered {answer.status_code}")
    elif scheme in ("postgresql", "mysql", "mssql"):
        url = urlsplit(tracking_uri)
        port = url.port or {"postgresql": 5432, "mysql": 3306, "mssql": 1433}[scheme]
        with socket.create_connection((url.hostname or "localhost", port), timeout_s):
            pass
    elif scheme in ("", "file", "sqlite"):
        if scheme == "sqlite":
            path = Path(tracking_uri.removeprefix("sqlite:///").split("?", 1)[0])
        else:
            path = Path(urlsplit(tracking_uri).path if scheme else tracking_uri)
        while not path.exists() and path != path.parent:  # made on first use
            path = path.parent
        if not os.access(path if path.is_dir() else path.parent, os.W_OK):
            raise OSError(f"{path} is not writable")
    else:
        return False
    return True


# MLflow reads the S3 endpoint from this variable whenever it makes an S3 client (see the module
# docstring); the only place Reef writes the environment.
_s3_endpoint = EnvOverride("MLFLOW_S3_ENDPOINT_URL")


def s3_endpoint(endpoint_url: str | None) -> Any:
    """A context in which MLflow's own S3 calls (run artifacts, dataset inputs) go to
    `endpoint_url` (None: MLflow's default, AWS); for code that logs to MLflow directly."""
    return _s3_endpoint(endpoint_url)
