"""An application's traffic against a Reef server: chat calls through the official openai SDK,
then a report per receipt (`POST /reef/report`) — what the flow tests, the vLLM test and the
benchmarks feed the loop with. Needs the openai SDK, which the `dev` extra installs (serving
does not)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import httpx
import openai

Report = Callable[[int, str], dict[str, Any]]


class _Server(Protocol):
    @property
    def url(self) -> str: ...


def _root(server: _Server | str) -> str:
    return (server if isinstance(server, str) else server.url).rstrip("/")


def traffic(
    server: _Server | str,
    scenario: str,
    n: int,
    *,
    prompt: str | Callable[[int], str] = "q{i}",
    report: Report | None = None,
    model: str = "tiny",
    **sampling: Any,
) -> list[str]:
    """`n` chat calls in `scenario`, one user message each (`prompt` formatted with `i`, or
    called with it); a sampling value that is callable is called with `i` too (`seed=lambda
    i: i`). With `report`, each receipt is reported with the body `report(i, receipt)` right
    after its call. Returns the receipts (`x-reef-agent-record-id`) in call order."""
    url = _root(server)
    headers = {"x-reef-scenario": scenario}
    receipts: list[str] = []
    with (
        openai.OpenAI(
            base_url=f"{url}/v1", api_key="none", default_headers=headers, max_retries=0
        ) as client,
        httpx.Client(base_url=url, headers=headers, timeout=60) as http,
    ):
        for i in range(n):
            content = prompt(i) if callable(prompt) else prompt.format(i=i)
            kwargs = {k: v(i) if callable(v) else v for k, v in sampling.items()}
            raw = client.chat.completions.with_raw_response.create(
                model=model, messages=[{"role": "user", "content": content}], **kwargs
            )
            receipts.append(raw.headers["x-reef-agent-record-id"])
            if report is not None:
                _post(http, {"references": [receipts[-1]], **report(i, receipts[-1])})
    return receipts


def report_all(server: _Server | str, scenario: str, receipts: list[str], report: Report) -> None:
    """Report each receipt with the body `report(i, receipt)`."""
    with httpx.Client(
        base_url=_root(server), headers={"x-reef-scenario": scenario}, timeout=60
    ) as http:
        for i, receipt in enumerate(receipts):
            _post(http, {"references": [receipt], **report(i, receipt)})


def _post(http: httpx.Client, body: dict[str, Any]) -> None:
    r = http.post("/reef/report", json=body)
    if r.status_code != 201:
        raise AssertionError(f"POST /reef/report: {r.status_code} {r.text}")
