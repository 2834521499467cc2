"""The simulated app: asks questions through the official openai SDK, scores each answer
against its preference, and reports it to Reef (with a correction when it failed). The five-word
demo's chat and preference by default; the composite bench gives it demo/terse.py's."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import openai

from demo import preference


@dataclass(frozen=True)
class Answer:
    question: str
    reference: str
    text: str
    receipt: str  # x-reef-agent-record-id
    release_id: str  # x-reef-release-id: the release that served it
    score: float


class App:
    def __init__(
        self,
        url: str,
        scenario: str,
        model: str,
        max_tokens: int = 24,
        messages: Callable[[str], list[dict[str, str]]] = preference.messages,
        score: Callable[[str | None], float] = preference.score,
    ):
        self.url = url.rstrip("/")
        self.scenario = scenario
        self.model = model
        self.max_tokens = max_tokens
        self.messages = messages  # the chat the app sends for a question
        self.score = score  # the user's preference, 0.0 or 1.0
        headers = {"x-reef-scenario": scenario}
        self.client = openai.OpenAI(
            base_url=f"{self.url}/v1", api_key="unused", default_headers=headers, max_retries=0
        )
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=60.0)

    def close(self) -> None:
        self.client.close()
        self.http.close()

    def ask(self, question: str, reference: str) -> Answer:
        raw = self.client.chat.completions.with_raw_response.create(
            model=self.model,
            messages=self.messages(question),  # type: ignore[arg-type]
            max_tokens=self.max_tokens,
            temperature=0,
        )
        text = raw.parse().choices[0].message.content or ""
        return Answer(
            question,
            reference,
            text,
            raw.headers["x-reef-agent-record-id"],
            raw.headers["x-reef-release-id"],
            self.score(text),
        )

    def ask_all(self, pool: list[tuple[str, str]]) -> list[Answer]:
        """Every question at once: the embedded engine batches concurrent requests."""
        with ThreadPoolExecutor(max_workers=max(1, len(pool))) as ex:
            return list(ex.map(lambda qa: self.ask(*qa), pool))

    def ask_each(self, pool: list[tuple[str, str]]) -> list[Answer]:
        """One question after another, for answers that will be reported: Reef orders a
        round's samples by record id (creation time, then random bits within a millisecond),
        so concurrent requests would train on an order, and in engine batches, that change
        from run to run. One at a time, the pool's order is the training order."""
        return [self.ask(*qa) for qa in pool]

    def report(self, answer: Answer) -> None:
        """Feedback on one receipt: the score, and the reference answer as the correction when
        the answer broke the preference."""
        body: dict[str, object] = {"score": answer.score, "references": [answer.receipt]}
        if not answer.score:
            body["feedback"] = {"correction": answer.reference}
        r = self.http.post("/reef/report", json=body)
        if r.status_code not in (200, 201):
            raise RuntimeError(f"POST /reef/report: {r.status_code} {r.text}")

    def create_scenario(self, description: str = "learning demo: answers of <= 5 words") -> None:
        """The scenario exists (with its base release) before the first call; 409: it did."""
        r = self.http.post(
            "/reef/scenarios", json={"name": self.scenario, "description": description}
        )
        if r.status_code not in (201, 409):
            raise RuntimeError(f"POST /reef/scenarios: {r.status_code} {r.text}")

    def releases(self) -> list[dict]:
        """The scenario's release chain, newest first (a scenario is created on first use)."""
        r = self.http.get(f"/reef/scenarios/{self.scenario}/releases")
        if r.status_code == 404:
            return []
        r.raise_for_status()
        return list(r.json()["data"])

    def head(self) -> dict | None:
        return next((r for r in self.releases() if r["current"]), None)

    def candidates(self) -> list[dict]:
        r = self.http.get(f"/reef/scenarios/{self.scenario}/candidates")
        return list(r.json()["data"]) if r.status_code == 200 else []
