"""The dashboard's server side over real HTTP: sign-in sessions (HttpOnly, SameSite=Strict),
CSRF on every state change, scoped tokens confined server-side, admin actions refused to
anyone else, and the no-token loopback mode under the same Host/Origin rules as the API."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from api.auth import hash_token
from tests.reefserver import InProcessReef
from tests.traffic import traffic

ADMIN, ALICE = "ui-admin-token", "ui-alice-token"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    state: Path = tmp_path_factory.mktemp("reef-ui")
    config = state / "serve.yaml"
    config.write_text(
        "auth:\n  tokens:\n"
        f"    - {{name: ops, sha256: {hash_token(ADMIN)}, admin: true}}\n"
        f"    - {{name: alice, sha256: {hash_token(ALICE)}, scenarios: [alice]}}\n"
        "engine:\n  default_max_tokens: 4\n"
    )
    with InProcessReef(state, config=config) as srv:
        for name, token in (("alice", ALICE), ("bob", ADMIN)):
            with httpx.Client(
                base_url=srv.url,
                headers={"authorization": f"Bearer {token}", "x-reef-scenario": name},
            ) as http:
                body = {"model": "tiny", "messages": [{"role": "user", "content": f"hi {name}"}]}
                rid = http.post("/v1/chat/completions", json=body).headers["x-reef-agent-record-id"]
                http.post(
                    "/reef/report", json={"references": [rid], "score": 0.5}
                ).raise_for_status()
        yield srv


@contextmanager
def _signed_in(srv: InProcessReef, token: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.url, follow_redirects=False) as client:
        r = client.post("/ui/login", data={"token": token, "next": "/ui"})
        assert r.status_code == 303, r.text
        yield client


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


def test_pages_need_a_session(secured: InProcessReef) -> None:
    r = httpx.get(f"{secured.url}/ui/s/alice/records")
    assert r.status_code == 303
    assert r.headers["location"] == "/ui/login?next=/ui/s/alice/records"
    # a bearer token is the API's; the dashboard's pages take only their own session
    r = httpx.get(f"{secured.url}/ui", headers={"authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 303


def test_sign_in_sets_a_strict_httponly_cookie(secured: InProcessReef) -> None:
    with httpx.Client(base_url=secured.url) as client:
        bad = client.post("/ui/login", data={"token": "wrong"})
        assert bad.status_code == 401 and "invalid API key" in bad.text
        ok = client.post("/ui/login", data={"token": ADMIN, "next": "https://evil.example/"})
        assert ok.status_code == 303
        assert ok.headers["location"] == "/ui"  # never an open redirect
        cookie = ok.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
        assert ADMIN not in ok.headers["set-cookie"]  # an opaque session id, not the token
        page = client.get("/ui")
        assert page.status_code == 200
        assert "alice" in page.text and "bob" in page.text
        assert page.headers["cache-control"] == "no-store"
        client.post("/ui/logout", data={"csrf": _csrf(page.text)})
        assert client.get("/ui", follow_redirects=False).status_code == 303


def test_scoped_token_sees_only_its_scenarios(secured: InProcessReef) -> None:
    with _signed_in(secured, ALICE) as client:
        page = client.get("/ui")
        assert page.status_code == 200
        assert "/ui/s/alice/" in page.text and "/ui/s/bob/" not in page.text
        for path in ("records", "releases", "candidates", "curves", "jobs", "readiness"):
            assert client.get(f"/ui/s/bob/{path}").status_code == 403, path
            assert client.get(f"/ui/s/alice/{path}").status_code == 200, path
        records = client.get("/ui/s/alice/records").text
        assert "hi alice" in records
        releases = client.get("/ui/s/alice/releases")
        assert "Roll back" not in releases.text  # no admin action shown...
        base = re.search(r'id="(rel_[0-9a-z]+)"', releases.text)
        assert base
        # ...and none done, whatever the browser sends
        for action in ("rollback", "promote", "reject", "evolve"):
            r = client.post(
                f"/ui/s/alice/{action}",
                data={"csrf": _csrf(releases.text), "release_id": base.group(1)},
            )
            assert r.status_code == 403, action
            assert "not an admin token" in r.text


def test_state_changes_need_the_csrf_token(secured: InProcessReef) -> None:
    with _signed_in(secured, ADMIN) as client:
        page = client.get("/ui/s/bob/releases").text
        assert "Roll back" not in page  # only the base release: nothing to roll back to
        for data in ({"release_id": "x"}, {"csrf": "forged"}):
            r = client.post("/ui/s/bob/evolve", data=data)
            assert r.status_code == 403 and "CSRF" in r.text
        # a cross-site form post is refused by the guard before any handler runs
        r = client.post(
            "/ui/s/bob/evolve",
            data={"csrf": _csrf(page)},
            headers={"origin": "https://evil.example", "sec-fetch-site": "cross-site"},
        )
        assert r.status_code == 403 and "cross-site" in r.text
        # the real thing: refused only because this server runs no evolve worker
        r = client.post("/ui/s/bob/evolve", data={"csrf": _csrf(page)})
        assert r.status_code == 503 and "no evolve worker" in r.text


def test_records_filters_and_session(secured: InProcessReef) -> None:
    with _signed_in(secured, ADMIN) as client:
        page = client.get("/ui/s/bob/records", params={"q": "HI BOB", "feedback": "yes"}).text
        assert "hi bob" in page
        assert "hi bob" not in client.get("/ui/s/bob/records", params={"q": "nothing"}).text
        assert "hi bob" not in client.get("/ui/s/bob/records", params={"feedback": "no"}).text
        assert "hi bob" in client.get("/ui/s/bob/records", params={"min_score": "0.5"}).text
        assert "hi bob" not in client.get("/ui/s/bob/records", params={"min_score": "0.6"}).text
        bad = client.get("/ui/s/bob/records", params={"min_score": "high"})
        assert bad.status_code == 400
        link = re.search(r'href="(/ui/s/bob/records/rec_[0-9a-z]+)"', page)
        assert link
        transcript = client.get(link.group(1), follow_redirects=True)
        assert transcript.status_code == 200
        assert "score 0.50" in transcript.text and "hi bob" in transcript.text


def test_no_token_mode_needs_no_sign_in(server: InProcessReef, scenario: str) -> None:
    traffic(server, scenario, 2, report=lambda i, rid: {"score": float(i)}, max_tokens=3)
    page = httpx.get(f"{server.url}/ui")
    assert page.status_code == 200 and f"/ui/s/{scenario}/records" in page.text
    assert "Sign out" not in page.text
    curves = httpx.get(f"{server.url}/ui/s/{scenario}/curves")
    assert curves.status_code == 200 and "uPlot.iife.min.js" in curves.text
    assert httpx.get(f"{server.url}/ui/static/uPlot.iife.min.js").status_code == 200
    # the same Host rule as the API: a rebound name is not answered
    evil = httpx.get(f"{server.url}/ui", headers={"host": "attacker.example"})
    assert evil.status_code == 421
    csrf = _csrf(httpx.get(f"{server.url}/ui/s/{scenario}/jobs").text)
    r = httpx.post(
        f"{server.url}/ui/s/{scenario}/evolve",
        data={"csrf": csrf},
        headers={"origin": "http://localhost:9", "sec-fetch-site": "same-site"},
    )
    assert r.status_code == 403  # another port of localhost is another site
