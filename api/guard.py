"""The guard against browsers: a Host allow-list (DNS rebinding) and no cross-site writes (CSRF).

Without tokens every caller on loopback is admin, and a browser is a caller on loopback: any
web page can send requests to 127.0.0.1, and a rebound DNS name can read the answers. Browsers
say what they are doing, and SDKs, curl and engines send none of it:

- `Host`: the name the page reached us by. Only loopback names, `server.allowed_hosts` and the
  bound host are answered; any other name is 421 (a rebinding attack's name never is ours).
- `Sec-Fetch-Site` (every current browser) and `Origin`: a state-changing request (POST, PUT,
  PATCH, DELETE) from another site is 403. `same-site` is refused too: a page on another port of
  localhost is same-site with us.

A pure ASGI middleware that scans the raw header list once: it runs on every inference call
(bench/upstream_overhead.py measures that path).
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from reef.api.errors import error_body
from reef.api.metrics import Metrics
from reef.errors import Forbidden, MisdirectedRequest, ReefError
from reef.settings import ServerSettings, host_name

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_HOST = b"host"
_ORIGIN = b"origin"
_FETCH_SITE = b"sec-fetch-site"
_SAME = frozenset({b"same-origin", b"none"})  # `none`: the user typed it, or a bookmark


def allowed_hosts(server: ServerSettings) -> frozenset[str] | None:
    """The Host names this server answers to (None: any).

    Loopback names always; `server.allowed_hosts`; and the bound host when it is a name or an
    address of its own. A wildcard bind (0.0.0.0, ::) with no allowed_hosts answers any Host:
    it is reached by names it cannot know, and off loopback tokens are required (a browser
    never attaches them by itself), so set allowed_hosts to the public names to pin them."""
    names = set(LOOPBACK_NAMES) | set(server.allowed_hosts)
    if "*" in names:
        return None
    try:
        bound = host_name(server.host)
    except ValueError:  # not a name a Host header carries: nothing to add
        bound = server.host.lower()
    if bound in ("0.0.0.0", "[::]"):
        if not server.allowed_hosts:
            return None
    else:
        names.add(bound)
    return frozenset(names)


def _name(host: str) -> str:
    """A Host header's name without its port, lower case."""
    host = host.lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] or host
    return host.rpartition(":")[0] if ":" in host else host


def _allowed(name: str, names: frozenset[str]) -> bool:
    if name in names:
        return True
    if name.startswith("["):  # an IPv6 address in any spelling
        try:
            name = f"[{ipaddress.IPv6Address(name[1:-1])}]"
        except ValueError:
            return False
        return name in names
    # `*.example.com` entries: any subdomain
    dot = name.find(".")
    while dot != -1:
        if "*" + name[dot:] in names:
            return True
        dot = name.find(".", dot + 1)
    return False


class BrowserGuard:
    """Refuses what only a hostile page would send: a foreign Host (421) and a cross-site
    state-changing request (403), as OpenAI-style error JSON."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str] | None, metrics: Metrics):
        self.app = app
        self.allowed = allowed
        self.metrics = metrics
        # Host headers seen and found allowed: the hot path is one set lookup.
        self._seen: set[bytes] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = origin = site = None
        for key, value in scope["headers"]:
            if key == _HOST:
                host = value
            elif key == _ORIGIN:
                origin = value
            elif key == _FETCH_SITE:
                site = value
        err: ReefError | None = None
        if host is not None and self.allowed is not None and host not in self._seen:
            if _allowed(_name(host.decode("latin-1")), self.allowed):
                if len(self._seen) < 1024:
                    self._seen.add(host)
            else:
                err = MisdirectedRequest(
                    f"this server does not answer for host '{host.decode('latin-1')[:100]}': "
                    "add it to server.allowed_hosts if it should"
                )
        if err is None and scope["method"] in _WRITES:
            if site is not None and site not in _SAME:
                err = _cross_site(f"Sec-Fetch-Site: {site.decode('latin-1')[:40]}")
            elif origin is not None and not self._same_origin(origin, host):
                err = _cross_site(f"Origin: {origin.decode('latin-1')[:200]}")
        if err is not None:
            await self._refuse(scope, send, err)
            return
        await self.app(scope, receive, send)

    def _same_origin(self, origin: bytes, host: bytes | None) -> bool:
        """Whether a page at `origin` may write: its host is one this server answers for
        (with any Host answered, the request's own Host)."""
        try:
            netloc = urlsplit(origin.decode("latin-1")).netloc  # `null` has none
        except ValueError:
            return False
        if not netloc or "@" in netloc:
            return False
        if self.allowed is None:
            return host is not None and netloc.lower() == host.decode("latin-1").lower()
        return _allowed(_name(netloc), self.allowed)

    async def _refuse(self, scope: Scope, send: Send, err: ReefError) -> None:
        self.metrics.errors.labels(err.type, err.code or "").inc()
        anthropic = str(scope.get("path", "")).startswith("/v1/messages")
        body = orjson.dumps(error_body(err, anthropic=anthropic))
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": err.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _cross_site(what: str) -> Forbidden:
    return Forbidden(
        f"cross-site request refused ({what}): a web page may not change anything here; "
        "clients that are not browsers send neither header",
        code="cross_site_request",
    )
