"""Webhook events from a served Reef app (tiny model, SQLite, MLflow) to a real HTTP receiver on
loopback that refuses each event's first two tries and accepts the third: every kind the
release chain emits arrives signed (HMAC-SHA256 of the body under the webhook's secret), with
the same event id and body on every try, only once the change it tells of is durable (the
receiver reads the database when the event arrives), and the outbox shows it delivered."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from reef.cli.testing import InProcessReef
from reef.deploy import rollout
from reef.deploy.chain import ReleaseChain
from reef.events import verify
from reef.gate import Decision
from reef.harness import Harness
from reef.provenance import Provenance
from reef.records import Candidate
from reef.settings import load_settings

SECRET = "test-secret-0123456789"
RELEASES_SECRET = "another-secret-0123456789"
FAILS = 2  # tries refused per event before one is accepted


class Receiver:
    """A webhook receiver: records every POST (path, headers, body) and what the database said
    of the event's subject at that moment; answers 500 to an event's first FAILS tries."""

    def __init__(self, database: Path):
        self.database = database
        self.posts: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                event = json.loads(body)
                with receiver.lock:
                    tries = sum(
                        1
                        for p in receiver.posts
                        if p["event"]["id"] == event["id"] and p["path"] == self.path
                    )
                    receiver.posts.append(
                        {
                            "path": self.path,
                            "headers": dict(self.headers),
                            "body": body,
                            "event": event,
                            "seen": receiver.seen(event),
                            "accepted": tries >= FAILS,
                        }
                    )
                self.send_response(200 if tries >= FAILS else 500)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def seen(self, event: dict[str, Any]) -> str | None:
        """What the database holds now for the event's subject: whether a published (or
        promoted) release is on the chain, or the candidate's status."""
        data = event["data"]
        with sqlite3.connect(self.database) as conn:
            if event["type"] in ("release.published", "rollout.promoted"):
                row = conn.execute(
                    "SELECT id FROM releases WHERE id = ?", (data["release_id"],)
                ).fetchone()
                return "on the chain" if row else None
            if "candidate_id" in data:
                row = conn.execute(
                    "SELECT status FROM candidates WHERE id = ?", (data["candidate_id"],)
                ).fetchone()
                return row[0] if row else None
        return None

    def accepted(self, path: str = "/hook") -> list[dict[str, Any]]:
        with self.lock:
            return [p for p in self.posts if p["accepted"] and p["path"] == path]


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Receiver]:
    r = Receiver(tmp_path / "state" / "reef.db")
    r.thread.start()
    yield r
    r.server.shutdown()
    r.server.server_close()


def _server(tmp_path: Path, receiver: Receiver) -> InProcessReef:
    webhooks = [
        {"url": f"{receiver.url}/hook", "secret": SECRET},
        {
            "url": f"{receiver.url}/releases",
            "secret": RELEASES_SECRET,
            "events": ["release.published"],
        },
    ]
    return InProcessReef(
        tmp_path / "state",
        events={"webhooks": webhooks, "poll_s": 0.2, "backoff_s": 0.2},
        rollout={"min_samples": 1000},  # the watcher never decides a canary on its own
    )


def _wait(receiver: Receiver, kinds: list[str], timeout_s: float = 60.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = [p["event"]["type"] for p in receiver.accepted()]
        if sorted(got) == sorted(kinds):
            return receiver.accepted()
        time.sleep(0.1)
    raise AssertionError(f"accepted {[p['event']['type'] for p in receiver.accepted()]}")


def _decision(status: str, **more: Any) -> Decision:
    return Decision(status=status, policy="improve", test="bootstrap", reason=status, n=4, **more)  # type: ignore[arg-type]


def _candidate(chain: ReleaseChain, scenario: str, rules: str, decision: Decision) -> Candidate:
    harness = Harness({"AGENTS.md": rules, "harness.json": '{"inject": true}'})
    chain.store.ensure_scenario(scenario)
    head = chain.store.head_release(scenario)
    return chain.add_harness_candidate(head, harness, decision, Provenance(recipe="test"))


def _every_change(chain: ReleaseChain, scenario: str) -> list[str]:
    """Each change the chain tells webhooks of, in order; the kinds expected at /hook."""
    broken = _decision("rejected", broken_guard="safety")
    _candidate(chain, scenario, "Never.\n", broken)  # rejected by a broken guard
    held = _candidate(chain, scenario, "Maybe.\n", _decision("pending"))
    chain.reject(held, "declined by a person")
    accepted = _candidate(chain, scenario, "Be brief.\n", _decision("accepted"))
    chain.publish(accepted)
    verdict = {"action": "promote", "reason": "test"}
    rollout.start(chain, _candidate(chain, scenario, "Be kind.\n", _decision("accepted")))
    rollout.promote(chain, scenario, by="test", verdict=verdict)
    rollout.start(chain, _candidate(chain, scenario, "Be loud.\n", _decision("accepted")))
    rollout.abort(chain, scenario, by="test", reason="worse", verdict=verdict)
    return [
        "candidate.rejected",
        "guard.failed",
        "candidate.pending_approval",
        "candidate.rejected",
        "release.published",
        "rollout.promoted",
        "release.published",
        "rollout.rolled_back",
        "release.published",
    ]


def test_events_are_signed_retried_with_one_id_and_sent_once_durable(
    tmp_path: Path, receiver: Receiver
) -> None:
    with _server(tmp_path, receiver) as srv, ReleaseChain.for_settings(srv.settings) as chain:
        kinds = _every_change(chain, "hooks")
        accepted = _wait(receiver, kinds)
        published = [p for p in accepted if p["event"]["type"] == "release.published"]
        deadline = time.monotonic() + 30
        while len(receiver.accepted("/releases")) < len(published):
            assert time.monotonic() < deadline, receiver.accepted("/releases")
            time.sleep(0.1)

        for post in accepted:
            event, headers = post["event"], post["headers"]
            assert verify(SECRET, post["body"], headers["x-reef-signature"])
            assert not verify(RELEASES_SECRET, post["body"], headers["x-reef-signature"])
            assert headers["x-reef-event-id"] == event["id"] and event["id"].startswith("evt_")
            assert headers["x-reef-event"] == event["type"] and event["scenario"] == "hooks"
            tries = [p for p in receiver.posts if p["event"]["id"] == event["id"]]
            tries = [p for p in tries if p["path"] == "/hook"]
            # refused twice, then accepted: the same body, id and signature every time
            assert [p["accepted"] for p in tries] == [False] * FAILS + [True]
            assert {p["body"] for p in tries} == {post["body"]}
            assert [p["headers"]["x-reef-delivery-attempt"] for p in tries] == ["1", "2", "3"]
            # sent only once the change it tells of was committed
            assert {p["seen"] for p in tries} <= _durable(event), event

        # the releases webhook took its one kind, under its own secret, with the same ids
        for post in receiver.accepted("/releases"):
            assert post["event"]["type"] == "release.published"
            assert verify(RELEASES_SECRET, post["body"], post["headers"]["x-reef-signature"])
        assert {p["event"]["id"] for p in receiver.accepted("/releases")} == {
            p["event"]["id"] for p in published
        }

        rejected = [p["event"] for p in accepted if p["event"]["type"] == "guard.failed"]
        assert rejected[0]["data"]["gate"]["broken_guard"] == "safety"
        # the outbox says delivered, after 3 tries each (the sender marks a row once the
        # receiver's 200 is back, so the last rows may still be settling)
        rows = _settled(chain, len(kinds) + len(published))
        assert len(rows) == len(kinds) + len(published)
        assert {(r.status, r.attempts) for r in rows} == {("delivered", FAILS + 1)}

        page = httpx.get(f"{srv.url}/ui/s/hooks/jobs")
        assert page.status_code == 200
        assert "rollout.rolled_back" in page.text and "delivered" in page.text


def _settled(chain: ReleaseChain, expected: int, timeout_s: float = 15.0) -> list[Any]:
    """The scenario's outbox rows once `expected` of them are there and none is pending."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = chain.store.recent_deliveries("hooks", 100)
        if len(rows) == expected and all(r.status != "pending" for r in rows):
            return rows
        if time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def _durable(event: dict[str, Any]) -> set[str]:
    """What the database may say of an event's subject once its change is committed (a held
    candidate may be declined by the time its event arrives: that is an event of its own)."""
    return {
        "candidate.rejected": {"rejected"},
        "guard.failed": {"rejected"},
        "candidate.pending_approval": {"pending", "rejected"},
        "release.published": {"on the chain"},
        "rollout.promoted": {"on the chain"},
        "rollout.rolled_back": {"rolled_back"},
    }[event["type"]]


def test_webhook_settings_are_checked() -> None:
    with pytest.raises(Exception, match="unknown event kinds"):
        load_settings(
            events={"webhooks": [{"url": "http://h/x", "secret": SECRET, "events": ["x"]}]}
        )
    with pytest.raises(Exception, match="at least 16"):
        load_settings(events={"webhooks": [{"url": "http://h/x", "secret": "short"}]})
    with pytest.raises(Exception, match="once"):
        hook = {"url": "http://h/x", "secret": SECRET}
        load_settings(events={"webhooks": [hook, hook]})
