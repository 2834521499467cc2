"""Bearer-token auth: tokens live in the config as sha256 hashes, each admin or scenario-bound."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from starlette.requests import Request

from reef.errors import Forbidden, Unauthorized
from reef.settings import TokenSettings


@dataclass(frozen=True)
class Principal:
    name: str
    admin: bool
    scenarios: frozenset[str] = frozenset()
    reviewer: bool = False  # reviews turns of its scenarios; no release actions

    def may_use(self, scenario: str) -> bool:
        return self.admin or scenario in self.scenarios

    def require(self, scenario: str) -> None:
        if not self.may_use(scenario):
            raise Forbidden(f"token '{self.name}' may not use scenario '{scenario}'")

    def require_admin(self, what: str) -> None:
        if self.admin:
            return
        if self.reviewer:
            raise Forbidden(
                f"token '{self.name}' is a reviewer token: it reviews turns but may not "
                f"{what}; that needs an admin token"
            )
        raise Forbidden(f"token '{self.name}' is not an admin token; {what} needs one")

    @property
    def may_review(self) -> bool:
        return self.admin or self.reviewer

    def require_reviewer(self, scenario: str) -> None:
        """May review `scenario`'s turns: in scope, and an admin or a reviewer token."""
        self.require(scenario)
        if not self.may_review:
            raise Forbidden(
                f"token '{self.name}' may not review turns: that needs a reviewer or an admin "
                "token (auth.tokens[].reviewer)"
            )


ANONYMOUS = Principal("anonymous", admin=True)

# Where a request's principal is kept once known (the error handler shows admins more).
PRINCIPAL = "reef.principal"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return f"reef_{secrets.token_urlsafe(32)}"


class Authenticator:
    """Maps a request to its Principal. With no tokens configured everyone is admin; the
    settings refuse that unless the server binds loopback only."""

    def __init__(self, tokens: tuple[TokenSettings, ...], engine_token: str | None = None):
        self._by_hash = {
            t.sha256: Principal(t.name, t.admin, frozenset(t.scenarios), t.reviewer) for t in tokens
        }
        if engine_token and self._by_hash:
            # the evolve worker's deploys: an admin token that lives as long as the process
            self._by_hash[hash_token(engine_token)] = Principal("engine", admin=True)

    @property
    def enabled(self) -> bool:
        return bool(self._by_hash)

    def principal(self, request: Request) -> Principal:
        principal = self._principal(request)
        request.scope[PRINCIPAL] = principal
        return principal

    def _principal(self, request: Request) -> Principal:
        if not self._by_hash:
            return ANONYMOUS
        token = None
        header = request.headers.get("authorization")
        if header and header[:7].lower() == "bearer ":
            token = header[7:].strip()
        token = token or request.headers.get("x-api-key")
        if not token:
            raise Unauthorized(
                "missing API key: send 'Authorization: Bearer <token>' or 'x-api-key: <token>'"
            )
        return self.check(token)

    def known(self, token_sha256: str) -> Principal | None:
        """The principal of the configured token with this digest, if it is configured now
        (a dashboard session names its token by digest)."""
        return self._by_hash.get(token_sha256)

    def check(self, token: str) -> Principal:
        """The principal a token stands for (the dashboard's sign-in asks this too)."""
        if not self._by_hash:
            return ANONYMOUS
        principal = self._by_hash.get(hash_token(token))
        if principal is None:
            raise Unauthorized("invalid API key")
        return principal
