"""The engine admin interface as deploys see it: load, verify, unload a release's variant.

Two implementations of one small Protocol: `EngineAdmin` speaks HTTP to a serving process
(`reef serve` serves vLLM's adapter routes plus a few of its own), so a flow in a worker
process reaches the engine of the API process; `reef serve` itself deploys in-process through
the same Protocol (api/services.py). `EngineAdmin` is also the one client of a server's admin
routes (the `reef releases|rollback|promote` commands): its errors are read in one place.
"""

from __future__ import annotations

from typing import Any, Protocol

import httpx

from reef.errors import EngineUnavailable, ReefError
from reef.settings import Settings


class DeployError(ReefError):
    """The engine refused or failed a deploy step."""

    status = 502
    type = "server_error"
    code = "deploy_failed"


class EngineTarget(Protocol):
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
