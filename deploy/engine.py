"""The engine admin interface as deploys see it: load, verify, unload a release's variant.

Two implementations of one small Protocol: `EngineAdmin` speaks HTTP to a serving process
(`reef serve` serves vLLM's adapter routes plus a few of its own), so a flow in a worker
process reaches the engine of the API process; `reef serve` itself deploys in-process through
the same Protocol (api/services.py). `EngineAdmin` is also the one client of a server's admin
routes (the `reef releases|rollback|promote` commands): its errors are read in one place.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn, Protocol, TypeVar
from urllib.parse import urlsplit

import httpx

from reef.errors import EngineUnavailable, ReefError
from reef.settings import Settings
from reef.store.engines import EngineStore

log = logging.getLogger(__name__)
T = TypeVar("T")


class DeployError(ReefError):
    """The engine refused or failed a deploy step."""

    status = 502
    type = "server_error"
    code = "deploy_failed"


class EngineTarget(Protocol):
    # False for an engine that cannot load releases (upstream): it serves base releases only,
    # with or without a harness.
    loads_releases: bool

    def load(self, name: str, kind: str, source: str) -> dict[str, Any]:
        """Load `source` (a directory or artifact uri) as variant `name` (never in place)."""
        ...

    def verify(self, name: str) -> dict[str, Any]:
        """A smoke generation on the variant; raises when it fails."""
        ...

    def unload(self, name: str) -> None: ...

    def variants(self) -> list[str]: ...

    def refresh(self, scenario: str) -> None:
        """Serve the scenario's new head now (drop cached scenario state)."""
        ...


class EngineAdmin:
    """HTTP client for a serving process's admin routes (admin token when auth is on)."""

    # What the server's engine can load is its answer to a load (400 not_deployable).
    loads_releases = True

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 300.0):
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.base_url = base_url.rstrip("/")
        self._client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self._client.close()

    @classmethod
    def for_settings(cls, settings: Settings, url: str | None = None) -> EngineAdmin:
        """The client of the configured serving process (`settings.engine_url`), with the
        engine token a worker was handed (`reef.engine_token`), if any."""
        secret = settings.reef.engine_token
        return cls(url or settings.engine_url, secret.get_secret_value() if secret else None)

    def request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """One admin call; DeployError (with the server's message) for a transport error or
        an error status.

        A kept-alive connection the server closed meanwhile (it does after answering a 500)
        fails before the server reads the request: that one is sent again, once, on a new
        connection. The admin calls are safe to repeat (a name is never loaded twice)."""
        for attempt in (1, 2):
            try:
                r = self._client.request(method, path, json=body)
                break
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as e:
                if attempt == 2:
                    raise DeployError(f"engine at {self.base_url} unreachable: {e}") from None
            except httpx.HTTPError as e:
                raise DeployError(f"engine at {self.base_url} unreachable: {e}") from None
        return self._answer(r, path)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.request("POST", path, body)

    def _answer(self, r: httpx.Response, path: str) -> dict[str, Any]:
        if r.status_code >= 400:
            try:
                message = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = r.text[:500]
            raise DeployError(f"{path} on {self.base_url}: {r.status_code} {message}")
        try:
            data = r.json()
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {"data": data}

    def load(self, name: str, kind: str, source: str) -> dict[str, Any]:
        if kind == "adapter":
            return self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": source})
        return self._post("/reef/engine/weights", {"name": name, "path": source})

    def verify(self, name: str) -> dict[str, Any]:
        return self._post("/reef/engine/verify", {"name": name})

    def unload(self, name: str) -> None:
        self._post("/v1/unload_lora_adapter", {"lora_name": name})

    def variants(self) -> list[str]:
        return list(self.request("GET", "/reef/engine/variants").get("data", []))

    def refresh(self, scenario: str) -> None:
        self._post("/reef/engine/refresh", {"scenario": scenario})

    def generate(self, scenario: str, messages: list[dict[str, Any]], **options: Any) -> str:
        """One unrecorded generation on a release's weights (`release_id`, default the head;
        `max_tokens`, `temperature`, `seed`). EngineUnavailable when the engine cannot answer
        (transport errors, 429, 5xx); DeployError when it refuses the request (other 4xx)."""
        path = "/reef/engine/generate"
        body = {"scenario": scenario, "messages": messages, **options}
        try:
            r = self._client.post(path, json=body)
        except httpx.HTTPError as e:
            raise EngineUnavailable(f"engine at {self.base_url} unreachable: {e}") from None
        if r.status_code == 429 or r.status_code >= 500:
            raise EngineUnavailable(f"{path} on {self.base_url}: {r.status_code} {r.text[:300]}")
        return str(self._answer(r, path).get("text", ""))


class Fleet:
    """Every engine that serves the scenarios (reef serve replicas, Reef-fronted vLLM servers)
    as one EngineTarget: each call goes to all of them at once, so a deploy takes as long as
    its slowest engine, not their sum. `stage` is what a deploy needs on top: a release loaded
    and verified on every engine, or on none. A fleet of one behaves exactly as its engine
    (same errors, no threads).

    Members: the configured ones, then (`registered`) the engines registered in the database
    with a fresh heartbeat, read again at each call."""

    def __init__(
        self,
        members: Sequence[tuple[str, EngineTarget]],
        registered: Registered | None = None,
    ):
        if not members and registered is None:
            raise ValueError("a fleet needs at least one engine")
        self._configured = list(members)  # (label, engine): the label names it in errors
        self._registered = registered
        self.loads_releases = all(engine.loads_releases for _, engine in self._configured)

    @classmethod
    def of(cls, engine: EngineTarget) -> Fleet:
        """`engine` as a fleet: itself when it is one, else a fleet of one."""
        return engine if isinstance(engine, Fleet) else cls([("engine", engine)])

    @property
    def members(self) -> list[tuple[str, EngineTarget]]:
        """The engines a call reaches now."""
        if self._registered is None:
            return list(self._configured)
        known = {label for label, _ in self._configured}
        members = self._configured + [m for m in self._registered() if m[0] not in known]
        if not members:
            raise DeployError(
                "no engine to deploy to: none is registered with a fresh heartbeat "
                "(engine.fleet.registry) and engine.fleet.admin_urls is empty"
            )
        return members

    def close(self) -> None:
        for _, engine in self._configured:
            close = getattr(engine, "close", None)
            if close is not None:
                close()
        if self._registered is not None:
            self._registered.close()

    def _each(
        self, call: Callable[[EngineTarget], T], members: list[tuple[str, EngineTarget]]
    ) -> tuple[dict[str, T], dict[str, Exception]]:
        """`call` on every engine at once: the answers and the failures, by label."""
        if len(members) == 1:
            runs = [(label, _outcome(call, engine)) for label, engine in members]
        else:
            with ThreadPoolExecutor(max(len(members), 1), thread_name_prefix="fleet") as pool:
                futures = [(label, pool.submit(_outcome, call, e)) for label, e in members]
                runs = [(label, f.result()) for label, f in futures]
        done = {label: got for label, (got, err) in runs if err is None}
        failed = {label: err for label, (_, err) in runs if err is not None}
        return done, failed  # type: ignore[return-value]  # done's values are T

    def _call(self, what: str, call: Callable[[EngineTarget], T]) -> dict[str, T]:
        """`call` on every engine; raises (`_fail`) when any failed."""
        members = self.members
        done, failed = self._each(call, members)
        if failed:
            _fail(what, failed, len(members))
        return done

    def stage(self, name: str, kind: str, source: str) -> dict[str, Any]:
        """Load variant `name` on every engine and verify it there. If any engine fails, the
        variant is unloaded (best effort, logged) wherever this call loaded it, and DeployError
        names the failing engines. Returns `staged`: the engines this call loaded it on (an
        engine that held it already, e.g. serving it, is not among them: a later failure
        unloads it from these only); `verify`: each engine's answer."""

        def one(engine: EngineTarget) -> tuple[bool, dict[str, Any]]:
            held = name in engine.variants()
            staged = not held  # a load that fails half-way may leave it loaded
            try:
                loaded = engine.load(name, kind, source)
                staged = not held and loaded.get("loaded", True) is not False
                return staged, engine.verify(name)
            except BaseException:
                if staged:
                    _unstage(engine, name)
                raise

        members = self.members
        done, failed = self._each(one, members)
        staged = [label for label, (loaded, _) in done.items() if loaded]
        if failed:
            _unstage_from(members, name, staged)
            note = f"; unloaded again from {', '.join(staged)}" if staged else ""
            _fail(f"staging {name}", failed, len(members), note + "; the head stays")
        return {"staged": staged, "verify": {label: v for label, (_, v) in done.items()}}

    def unstage(self, name: str, labels: Sequence[str]) -> None:
        """Unload `name` from the engines `labels` (what `stage` loaded); failures are logged."""
        _unstage_from(self.members, name, labels)

    # EngineTarget: each call on every engine
    def load(self, name: str, kind: str, source: str) -> dict[str, Any]:
        """Load everywhere, or (unloading what this call loaded) nowhere."""
        members = self.members
        done, failed = self._each(lambda engine: engine.load(name, kind, source), members)
        if failed:
            loaded = [label for label, r in done.items() if r.get("loaded", True)]
            _unstage_from(members, name, loaded)
            _fail(f"loading {name}", failed, len(members))
        return {"name": name, "loaded": any(r.get("loaded", True) for r in done.values())}

    def verify(self, name: str) -> dict[str, Any]:
        done = self._call(f"verifying {name}", lambda engine: engine.verify(name))
        return {"name": name, "verified": True, "engines": done}

    def unload(self, name: str) -> None:
        self._call(f"unloading {name}", lambda engine: engine.unload(name))

    def variants(self) -> list[str]:
        """The variants any engine holds."""
        done = self._call("listing variants", lambda engine: engine.variants())
        return sorted({name for names in done.values() for name in names})

    def refresh(self, scenario: str) -> None:
        """Every engine serves the scenario's new head now; one that cannot be reached does
        within the scenario cache's TTL (reef.serving), or when it starts."""
        self._call(f"refreshing {scenario}", lambda engine: engine.refresh(scenario))


class Registered:
    """The engines registered in the database (engine.fleet.registry) whose heartbeat is at most
    engine.fleet.registry_ttl_s old, as fleet members: a replica that is down drops out of deploys
    and loads the head when it starts again (reef.variants.Variants.catch_up). One HTTP
    client per URL ever registered, kept until `close()` (a call in another thread may be
    using it)."""

    def __init__(self, settings: Settings, store: EngineStore, own: Sequence[str] = ()):
        self.settings = settings
        self.store = store
        self.own = own  # this process's own URLs: its engine is reached in process
        self._clients: dict[str, EngineAdmin] = {}
        self._lock = threading.Lock()  # a serving process's chain runs in several threads
        self._refused: set[str] = set()  # URLs already warned about

    def __call__(self) -> list[tuple[str, EngineTarget]]:
        urls = [
            url
            for url in self.store.live_engines(self.settings.engine.fleet.registry_ttl_s)
            if not any(_same_server(url, own) for own in self.own) and self._allowed(url)
        ]
        with self._lock:
            for url in urls:
                if url not in self._clients:
                    self._clients[url] = EngineAdmin.for_settings(self.settings, url)
            return [(url, self._clients[url]) for url in urls]

    def _allowed(self, url: str) -> bool:
        """Whether a deploy may reach (and hand the engine token to) a registered URL: any
        row in the table would otherwise receive it, over plain http too."""
        if registry_allows(self.settings.engine.fleet.registry_allow, url):
            return True
        if url not in self._refused:
            self._refused.add(url)
            log.warning(
                "registered engine %s left out of deploys: not loopback, and not an https URL "
                "of a host in engine.fleet.registry_allow",
                url,
            )
        return False

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients = {}


def registry_allows(allow: Sequence[str], url: str) -> bool:
    """Loopback engines always; others only over https, with a host named in `allow` (a
    name, `*.example.com` for its subdomains, `*` for any)."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower().rstrip(".")
    if host == "localhost" or _is_loopback_address(host):
        return True
    if parts.scheme != "https" or not host:
        return False
    if "*" in allow or host in allow or f"[{host}]" in allow:
        return True
    return any(entry.startswith("*.") and host.endswith(entry[1:]) for entry in allow)


def _is_loopback_address(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def engines_for(
    settings: Settings,
    local: tuple[str, EngineTarget] | None = None,
    store: EngineStore | None = None,
) -> EngineTarget:
    """The engines a deploy reaches: every `engine.fleet.admin_urls` entry over HTTP, and with
    engine.fleet.registry every engine registered in `store` with a fresh heartbeat; with neither,
    the one at `settings.engine_url`. In a serving process, `local` is (its own URL, its
    engine in process): its own entries are reached in process, and with neither list nor
    registry it deploys to itself only, as before. One configured engine and no registry:
    that engine as it is; else a Fleet."""
    registry = settings.engine.fleet.registry and store is not None
    urls: Sequence[str] = settings.engine.fleet.admin_urls
    if not urls and not registry and local is None:
        urls = [settings.engine_url]
    members: list[tuple[str, EngineTarget]] = []
    own: list[str] = []
    if local is not None:
        members.append(local)
        own = [local[0], settings.engine_advertise_url]
        urls = [u for u in urls if not any(_same_server(u, o) for o in own)]
    members += [(url, EngineAdmin.for_settings(settings, url)) for url in urls]
    if registry:
        assert store is not None
        return Fleet(members, Registered(settings, store, own))
    return members[0][1] if len(members) == 1 else Fleet(members)


_LOOPBACK = {"127.0.0.1", "localhost", "::1", "0.0.0.0", "::"}


def _same_server(url: str, own: str) -> bool:
    """Whether admin URL `url` names the server at `own` (a serving process's own URL): the
    same host and port, loopback names counted as one. A replica that does not recognize its
    own entry (a name only DNS knows) calls itself over HTTP: slower, not wrong."""
    a, b = urlsplit(url), urlsplit(own)
    if a.port != b.port:
        return False
    hosts = {a.hostname, b.hostname}
    return len(hosts) == 1 or hosts <= _LOOPBACK


def _outcome(
    call: Callable[[EngineTarget], T], engine: EngineTarget
) -> tuple[T | None, Exception | None]:
    try:
        return call(engine), None
    except Exception as e:
        return None, e


def _fail(what: str, failed: dict[str, Exception], size: int, note: str = "") -> NoReturn:
    """Raise for the engines of a fleet of `size` that failed `what`: a fleet of one
    re-raises its engine's error; a larger one names every failing engine in a DeployError."""
    first = next(iter(failed.values()))
    if size == 1:
        raise first
    reasons = "; ".join(f"engine {label}: {_message(e)}" for label, e in failed.items())
    raise DeployError(
        f"{what} failed on {len(failed)} of {size} engines ({reasons}){note}"
    ) from first


def _unstage_from(
    members: Sequence[tuple[str, EngineTarget]], name: str, labels: Sequence[str]
) -> None:
    for label, engine in members:
        if label in labels:
            _unstage(engine, name)


def _message(e: Exception) -> str:
    return e.message if isinstance(e, ReefError) else f"{type(e).__name__}: {e}"


def _unstage(engine: EngineTarget, name: str) -> None:
    try:
        engine.unload(name)
    except Exception as e:
        log.warning("unloading staged %s failed: %s", name, e)
