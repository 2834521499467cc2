"""The API docs are served from this server's own files: /docs (Swagger UI) and /redoc (ReDoc)
load only local scripts and styles, under a Content-Security-Policy that allows no inline or
foreign script; no vendored file names a CDN; `/` sends a browser to the dashboard. (The pages
rendering offline in a real browser: tests/ui/test_docs_browser.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from reef.cli.testing import InProcessReef

UI = Path(__file__).resolve().parents[2] / "api" / "ui"
CDN = re.compile(r"cdn\.|googleapis|gstatic|unpkg|jsdelivr|cdnjs", re.I)


@pytest.mark.parametrize(
    ("path", "script"), [("/docs", "swagger-ui-bundle.js"), ("/redoc", "redoc.standalone.js")]
)
def test_docs_pages_load_only_local_files(server: InProcessReef, path: str, script: str) -> None:
    r = httpx.get(f"{server.url}{path}")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    policy = dict(d.strip().split(" ", 1) for d in r.headers["content-security-policy"].split(";"))
    assert policy["script-src"] == "'self'" and policy["connect-src"] == "'self'"
    assert policy["frame-ancestors"] == "'none'"
    assert r.headers["x-frame-options"] == "DENY"
    assert "<script>" not in r.text  # nothing inline: the policy would refuse it
    loaded = re.findall(r'(?:src|href|spec-url|data-spec)="([^"]*)"', r.text)
    assert f"/ui/static/{script}" in loaded
    for url in loaded:
        assert url.startswith("/"), url
        assert httpx.get(f"{server.url}{url}").status_code == 200, url


def test_no_vendored_file_names_a_cdn() -> None:
    files = [*(UI / "static").iterdir(), *(UI / "templates").iterdir(), UI / "docs.py"]
    assert len(files) > 10
    named = [f.name for f in files if CDN.search(f.read_text(errors="replace"))]
    assert named == []


def test_root_redirects_to_the_dashboard(server: InProcessReef) -> None:
    r = httpx.get(f"{server.url}/")
    assert r.status_code == 307 and r.headers["location"] == "/ui"
    assert httpx.get(f"{server.url}/", follow_redirects=True).url.path == "/ui"
