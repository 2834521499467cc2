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

from reef.api.auth import hash_token
from reef.artifacts import open_artifacts
from reef.cli.testing import InProcessReef
from reef.figures import Figure, Point, save_figure
from reef.records import Release, new_id, utcnow
from reef.store.sql import open_store
from reef.testing.traffic import traffic

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
        for path in ("records", "archive", "releases", "candidates", "curves", "jobs", "readiness"):
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


def test_settings_page_saves_versions_as_the_admin_route_does(secured: InProcessReef) -> None:
    """An admin reads a scenario's learning settings, saves the next version from the form
    (who and when recorded, as PUT /reef/scenarios/{s}/settings does), and a bad edit or a
    stale form is refused with the page again, the edit kept; a scoped token sees no settings."""
    with _signed_in(secured, ALICE) as client:
        assert client.get("/ui/s/alice/settings").status_code == 403
        assert "/settings" not in client.get("/ui/s/alice/records").text  # no tab either
    with _signed_in(secured, ADMIN) as client:
        page = client.get("/ui/s/bob/settings")
        assert page.status_code == 200 and "Save as version 1" in page.text
        assert "batch_size: 32" in page.text  # the defaults, as they apply now
        form = {"csrf": _csrf(page.text), "expected_version": "0"}
        for keys, why in (
            ("reef: [1, 2", "not YAML"),
            ("reef:\n  batch_size: 0\n", "batch_size"),
            ("colour: blue\n", "colour"),
        ):
            r = client.post("/ui/s/bob/settings", data={**form, "keys": keys})
            assert r.status_code == 400 and "Not saved" in r.text and why in r.text, keys
            assert keys.split("\n")[0] in r.text  # the edit is kept
        r = client.post("/ui/s/bob/settings", data={**form, "keys": "reef:\n  batch_size: 3\n"})
        assert r.status_code == 303 and r.headers["location"].endswith("msg=settings_saved")
        page = client.get("/ui/s/bob/settings?msg=settings_saved")
        assert "settings saved" in page.text and "Save as version 2" in page.text
        assert "batch_size: 3" in page.text and "<td>ops</td>" in page.text
        # the same version through the admin route
        api = httpx.get(
            f"{secured.url}/reef/scenarios/bob/settings",
            headers={"authorization": f"Bearer {ADMIN}"},
        ).json()
        assert (api["version"], api["history"][0]["changed_by"]) == (1, "ops")
        assert api["effective"]["reef"]["batch_size"] == 3
        # a form read before that change is refused: 409, nothing overwritten
        r = client.post("/ui/s/bob/settings", data={**form, "keys": "reef: {batch_size: 5}"})
        assert r.status_code == 409 and "Not saved" in r.text
        assert client.post("/ui/s/bob/settings", data={"keys": ""}).status_code == 403  # no CSRF
        # back to the configuration's settings, for the other tests of this server
        latest = {"csrf": form["csrf"], "expected_version": "1", "keys": ""}
        assert client.post("/ui/s/bob/settings", data=latest).status_code == 303


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


def test_sessions_are_shared_by_replicas_and_flow_runs_link(
    secured: InProcessReef, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second app on the same database (another replica): a sign-in on one works on the
    other, with the same CSRF token, and signing out on either ends it on both. The release
    timeline links a release's flow run to the Prefect UI when its address is known."""
    assert secured.config is not None
    config = tmp_path / "replica.yaml"
    config.write_text(
        secured.config.read_text()
        + f"store:\n  database_url: {secured.settings.database_url}\n"
        + "prefect:\n  ui_url: http://prefect.example:4200/\n"
    )
    run_id = "7f0c6a53-2d7e-4b8a-9a51-0d6f1c2b3e4d"
    store = open_store(secured.settings.database_url)
    try:
        head = store.ensure_scenario("flows")
        store.publish_release(
            Release(
                id=new_id("rel"),
                scenario="flows",
                seq=1,
                parent_id=head.head_release_id,
                kind="adapter",
                created_at=utcnow(),
                operation="training",
                recipe="sft",
                metadata={
                    "flow_run_id": run_id,
                    # what a tttd step records (recipes.tttd.learner.best_metadata)
                    "best_score": 2.25,
                    "best_step": 3,
                    "best_program": {
                        "sha256": "ab" * 32,
                        "chars": 22,
                        "text": "print(sum(r) < 3 & 1)\n",
                        "truncated": False,
                        "file": "tttd/best.py",
                    },
                },
            )
        )
    finally:
        store.close()
    with (
        InProcessReef(tmp_path / "replica", config=config) as replica,
        _signed_in(secured, ADMIN) as first,
    ):
        cookie = first.cookies.get("reef_ui")
        assert cookie
        with httpx.Client(
            base_url=replica.url, cookies={"reef_ui": cookie}, follow_redirects=False
        ) as second:
            assert second.get("/ui").status_code == 200
            csrf = _csrf(second.get("/ui/s/bob/jobs").text)
            assert csrf == _csrf(first.get("/ui/s/bob/jobs").text)
            # the explicit prefect.ui_url: the flow run is a link
            page = second.get("/ui/s/flows/releases").text
            assert f'href="http://prefect.example:4200/runs/flow-run/{run_id}"' in page
            # a discovery step's best program and its verified score, escaped
            assert "verified score <b>2.25</b> (step 3)" in page
            assert "print(sum(r) &lt; 3 &amp; 1)" in page
            # no ui_url: derived from a Prefect server's PREFECT_API_URL, else no link
            monkeypatch.delenv("PREFECT_UI_URL", raising=False)
            monkeypatch.setenv("PREFECT_API_URL", "http://10.0.0.5:4200/api")
            page = first.get("/ui/s/flows/releases").text
            assert f'href="http://10.0.0.5:4200/runs/flow-run/{run_id}"' in page
            monkeypatch.delenv("PREFECT_API_URL")
            page = first.get("/ui/s/flows/releases").text
            assert run_id in page and "/runs/flow-run/" not in page
            # sign out on the replica: the session is gone on both
            out = second.post("/ui/logout", data={"csrf": csrf})
            assert out.status_code == 303
        assert first.get("/ui").status_code == 303
        with httpx.Client(base_url=replica.url, cookies={"reef_ui": cookie}) as again:
            assert again.get("/ui", follow_redirects=False).status_code == 303


def test_curves_show_demo_figures_and_release_metrics(secured: InProcessReef) -> None:
    """The learning page's other figures: a demo's numbers per release from the artifact
    store (reef.figures), and the numeric metrics releases recorded."""
    store = open_store(secured.settings.database_url)
    try:
        base = store.ensure_scenario("figs").head_release_id
        trained = store.publish_release(
            Release(
                id=new_id("rel"),
                scenario="figs",
                seq=1,
                parent_id=base,
                kind="adapter",
                created_at=utcnow(),
                operation="training",
                metrics={"tttd_best_reward": 1.75, "train_loss": 0.5, "flag": True},
            )
        )
    finally:
        store.close()
    artifacts = open_artifacts(secured.settings.artifacts_url)
    points = (Point(base, 0.25), Point(trained.id, 0.625), Point("rel_elsewhere", 0.9))
    save_figure(artifacts, "figs", Figure("pass", "held-out pass rate", "python -m demo", points))
    artifacts.put_bytes("figures/figs/broken.json", b"{")
    with _signed_in(secured, ADMIN) as client:
        page = client.get("/ui/s/figs/curves")
        assert page.status_code == 200
        html = page.text
        # the chooser: the demo's figure first, then the release metrics (numbers only)
        options = re.findall(r'<option value="\d+">([^<]+)</option>', html)
        assert options == [
            "held-out pass rate (python -m demo)",
            "train_loss (release metrics)",
            "tttd_best_reward (release metrics)",
        ]
        assert '<td class="num">0.625</td>' in html and '<td class="num">0.25</td>' in html
        assert "1 point(s) name releases not on this chain" in html
        assert "figures/figs/broken.json" in html  # reported, the page still renders
    with _signed_in(secured, ALICE) as client:  # another scenario's figures stay hidden
        assert client.get("/ui/s/figs/curves").status_code == 403


def test_readiness_cell_shows_the_judges_agreement_and_the_metrics(tmp_path: Path) -> None:
    """The overview's readiness cell: the judge's recent agreement with people and its interval,
    that its verdicts do not train while judge.min_agreement is not shown, and each declared
    metric over the scenario's reports."""
    from tests.experience.conftest import record, report

    config = tmp_path / "serve.yaml"
    config.write_text(
        "scenarios:\n  judged:\n    judge: {min_agreement: 0.7}\n"
        "    metrics: {helpful: {type: boolean}, tone: {type: categorical, values: [formal, casual]}}\n"
    )
    with InProcessReef(tmp_path / "state", config=config) as srv:
        store = open_store(srv.settings.database_url)
        try:
            base = store.ensure_scenario("judged").head_release_id
            recs = [record("judged", base) for _ in range(10)]
            store.add_records(recs)
            verdict = {"source": "judge", "verdict": 1, "judge": "test"}
            for i, rec in enumerate(recs):  # the judge says +1; people agree 9 times of 10
                store.add_report(report("judged", rec.id, score=1.0, metadata=verdict))
                metrics = {"helpful": i < 9, "tone": "formal" if i < 7 else "casual"}
                person = report("judged", rec.id, score=1.0 if i < 9 else 0.0, metrics=metrics)
                store.add_report(person)
        finally:
            store.close()
        with httpx.Client(base_url=srv.url) as http:
            cell = http.get("/ui/s/judged/readiness")
        assert cell.status_code == 200
        text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", cell.text))
        assert "agrees with people 9/10, recent 9/10 [0.65, 0.98]" in text
        assert "judge not trusted: its verdicts do not train" in text
        assert "helpful: 90% true (n 10)" in text
        assert "tone: formal 7 casual 3 (n 10)" in text


UI_HEADERS = {
    "x-frame-options": "DENY",
    "content-security-policy": "default-src 'self'; script-src 'self'; object-src 'none'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}


def _framing_headers(r: httpx.Response) -> None:
    for name, value in UI_HEADERS.items():
        assert r.headers.get(name) == value, (r.request.url, r.status_code, name)


def test_every_ui_answer_forbids_framing(secured: InProcessReef, server: InProcessReef) -> None:
    """No page of the dashboard can be framed by another site (its buttons clicked through a
    transparent frame), in either mode: pages, redirects, errors, assets, refusals."""
    with _signed_in(secured, ADMIN) as client:
        for path in ("/ui", "/ui/s/bob/records", "/ui/s/bob/releases", "/ui/s/nope!/records"):
            _framing_headers(client.get(path))
        _framing_headers(client.get("/ui/static/reef.js"))
        _framing_headers(client.get("/ui/static/missing.js"))  # 404
        _framing_headers(client.post("/ui/s/bob/evolve", data={"csrf": "forged"}))  # 403
    _framing_headers(httpx.get(f"{secured.url}/ui/s/bob/records"))  # 303 to sign in
    _framing_headers(httpx.get(f"{secured.url}/ui/login"))
    _framing_headers(httpx.post(f"{secured.url}/ui/login", data={"token": "wrong"}))  # 401
    _framing_headers(httpx.get(f"{server.url}/ui"))  # no-token mode
    _framing_headers(httpx.get(f"{server.url}/ui", headers={"host": "attacker.example"}))  # 421
    # the API is not a page: its answers stay as they were
    assert "x-frame-options" not in httpx.get(f"{server.url}/healthz").headers


def test_templates_need_no_inline_code() -> None:
    """The policy allows scripts and styles from files only: no template may hold an inline
    script, an event handler attribute, a style attribute or element, or a javascript: URL."""
    templates = Path(__file__).parents[2] / "api" / "ui" / "templates"
    inline_script = re.compile(r"<script(?![^>]*\b(?:src=|type=\"application/json\"))[^>]*>")
    forbidden = [
        inline_script,
        re.compile(r"\son[a-z]+\s*=", re.IGNORECASE),
        re.compile(r"\sstyle\s*=", re.IGNORECASE),
        re.compile(r"<style", re.IGNORECASE),
        re.compile(r"javascript:", re.IGNORECASE),
    ]
    found = [
        (f.name, pattern.pattern)
        for f in sorted(templates.glob("*.html"))
        for pattern in forbidden
        if pattern.search(f.read_text())
    ]
    assert found == []


def test_status_line_says_only_what_the_server_wrote(server: InProcessReef, scenario: str) -> None:
    """The status line after an action comes from a message key and a checked id: a link
    cannot make the dashboard say anything else."""
    traffic(server, scenario, 1, max_tokens=2)
    page = f"{server.url}/ui/s/{scenario}/records"
    for forged in (
        {"msg": "Session expired: sign in again at https://evil.example"},
        {"err": "Your token leaked: paste it at https://evil.example"},
        {"msg": "promoted", "id": "see https://evil.example"},
    ):
        text = httpx.get(page, params=forged).text
        assert "evil.example" not in text, forged
        assert 'role="alert"' not in text
    rid = "rel_" + "0" * 26
    shown = httpx.get(page, params={"msg": "promoted", "id": rid}).text
    assert f'role="status">{rid} is the head</p>' in shown
    shown = httpx.get(page, params={"msg": "promoted", "id": "see https://evil.example"}).text
    assert 'role="status">promoted: the head moved</p>' in shown  # the key's text, no id


def test_session_cookie_is_secure_off_loopback(tmp_path: Path, secured: InProcessReef) -> None:
    """Bound off loopback with tokens, sign-in travels over TLS (a proxy in front): the cookie
    is Secure even when the proxy speaks plain http to Reef. auth.secure_cookie decides
    explicitly."""
    from reef.api.ui.signin import secure_cookie
    from reef.settings import load_settings

    config = tmp_path / "serve.yaml"
    config.write_text(
        f"auth:\n  tokens:\n    - {{name: ops, sha256: {hash_token(ADMIN)}, admin: true}}\n"
        "server:\n  host: 0.0.0.0\n"
    )
    with InProcessReef(tmp_path / "state", config=config) as srv:
        r = httpx.post(f"{srv.url}/ui/login", data={"token": ADMIN})
        assert r.status_code == 303 and "; secure" in r.headers["set-cookie"].lower()
    on_loopback = httpx.post(f"{secured.url}/ui/login", data={"token": ADMIN})
    assert "; secure" not in on_loopback.headers["set-cookie"].lower()
    tokens = {"tokens": [{"name": "ops", "sha256": hash_token(ADMIN), "admin": True}]}
    wide = {"host": "0.0.0.0"}
    cases = [
        ({"auth": tokens, "server": wide}, "http", True),
        ({"auth": {**tokens, "secure_cookie": False}, "server": wide}, "http", False),
        ({"auth": {**tokens, "secure_cookie": True}}, "http", True),
        ({"auth": tokens}, "http", False),
        ({"auth": tokens}, "https", True),
    ]
    for overrides, scheme, want in cases:
        assert secure_cookie(load_settings(None, **overrides), scheme) is want, overrides
