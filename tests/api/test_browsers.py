"""What a hostile web page can send to a loopback Reef without tokens, refused: a body that is
not JSON (415), a foreign Host header (421, DNS rebinding), a cross-site state-changing request
(403) — each with the headers a browser sends. Clients that are not browsers send none of them
and pass."""

from __future__ import annotations

import httpx
import openai
import pytest

from reef.cli.testing import InProcessReef
from reef.settings import load_settings

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _error(r: httpx.Response, status: int, code: str) -> str:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert error["code"] == code, error
    return str(error["message"])


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        None,  # fetch() with a Blob body of no type sends none
    ],
)
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", CHAT),
        ("/v1/messages", {**CHAT, "max_tokens": 2}),
        ("/reef/report", {"score": 1, "references": ["rec_x"]}),
        ("/reef/scenarios/{scenario}/harness", {"files": {"harness.json": '{"inject": true}'}}),
        ("/v1/load_lora_adapter", {"lora_name": "x@y", "lora_path": "/tmp"}),
    ],
)
def test_a_body_that_is_not_json_is_415(
    server: InProcessReef, scenario: str, path: str, body: dict, content_type: str | None
) -> None:
    import orjson

    headers = {"x-reef-scenario": scenario}
    if content_type:
        headers["content-type"] = content_type
    url = server.url + path.format(scenario=scenario)
    r = httpx.post(url, content=orjson.dumps(body), headers=headers)
    assert "Content-Type: application/json" in _error(r, 415, "unsupported_media_type")
    if path == "/v1/messages":
        assert r.json()["type"] == "error"  # the Anthropic SDK's shape too
    if path.endswith("/harness"):  # nothing was released
        releases = httpx.get(f"{server.url}/reef/scenarios/{scenario}/releases")
        assert releases.status_code == 404 or len(releases.json()["data"]) == 1


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", "application/x+json"]
)
def test_json_content_types_pass(server: InProcessReef, scenario: str, content_type: str) -> None:
    import orjson

    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        content=orjson.dumps(CHAT),
        headers={"x-reef-scenario": scenario, "content-type": content_type},
    )
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "host",
    ["evil.example:8900", "evil.example", "127.0.0.1.evil.example", "localhost.evil.example"],
)
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_foreign_host_is_421(
    server: InProcessReef, scenario: str, host: str, method: str
) -> None:
    # what a page on a rebound DNS name sends: its own name in Host, our address underneath
    if method == "GET":
        r = httpx.get(f"{server.url}/reef/scenarios/{scenario}/records", headers={"Host": host})
    else:
        r = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, headers={"Host": host})
    assert f"host '{host}'" in _error(r, 421, "host_not_allowed")
    assert r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "host", ["localhost", "LOCALHOST:8900", "127.0.0.1", "127.0.0.1:{port}", "[::1]:{port}"]
)
def test_loopback_hosts_pass(server: InProcessReef, scenario: str, host: str) -> None:
    headers = {"Host": host.format(port=server.port), "x-reef-scenario": scenario}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, headers=headers)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},  # a page on another port of localhost
        {"Origin": "http://evil.example"},
        {"Origin": "http://evil.example:8900"},
        {"Origin": "null"},  # a sandboxed frame, a file:// page
        {"Origin": "http://localhost:3000", "Sec-Fetch-Site": "same-site"},
    ],
)
def test_cross_site_writes_are_403(server: InProcessReef, scenario: str, headers: dict) -> None:
    base = {"x-reef-scenario": scenario, "content-type": "application/json"}
    writes = [
        ("POST", "/v1/chat/completions", CHAT),
        ("POST", f"/reef/scenarios/{scenario}/harness", {"files": {"AGENTS.md": "obey"}}),
        ("POST", "/reef/scenarios", {"name": scenario}),
        ("DELETE", f"/reef/scenarios/{scenario}", None),
    ]
    for method, path, body in writes:
        r = httpx.request(method, server.url + path, json=body, headers={**base, **headers})
        assert "cross-site request refused" in _error(r, 403, "cross_site_request"), path
    assert httpx.get(f"{server.url}/reef/scenarios/{scenario}").status_code == 404  # none made


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "same-origin"},
        {"Sec-Fetch-Site": "none"},
        {"Origin": "http://127.0.0.1:{port}", "Sec-Fetch-Site": "same-origin"},
        {"Origin": "http://localhost:{port}"},  # a browser without Sec-Fetch-*
        {"Origin": "http://[::1]:{port}"},
    ],
)
def test_same_origin_writes_pass(server: InProcessReef, scenario: str, headers: dict) -> None:
    sent = {k: v.format(port=server.port) for k, v in headers.items()}
    r = httpx.post(
        f"{server.url}/v1/chat/completions",
        json=CHAT,
        headers={"x-reef-scenario": scenario, **sent},
    )
    assert r.status_code == 200, r.text


def test_cross_site_reads_are_left_to_the_browser(server: InProcessReef, scenario: str) -> None:
    # without CORS headers the page cannot read the answer; a foreign Host is what rebinding
    # needs, and that is refused above
    r = httpx.get(
        f"{server.url}/v1/models",
        headers={"Sec-Fetch-Site": "cross-site", "Origin": "http://evil.example"},
    )
    assert r.status_code == 200
    assert "access-control-allow-origin" not in r.headers


def test_sdks_pass(server: InProcessReef, scenario: str) -> None:
    client = openai.OpenAI(
        base_url=server.base_url, api_key="none", default_headers={"x-reef-scenario": scenario}
    )
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert chat.choices[0].message is not None


def test_allowed_hosts_default_and_setting() -> None:
    from reef.api.guard import allowed_hosts

    def hosts(**server: object) -> frozenset[str] | None:
        auth = {"tokens": [{"name": "t", "sha256": "0" * 64, "admin": True}]}
        return allowed_hosts(load_settings(server=server, auth=auth).server)

    loopback = {"localhost", "127.0.0.1", "[::1]"}
    assert hosts() == loopback
    assert hosts(allowed_hosts=["Reef.Example.COM", "::1"]) == loopback | {"reef.example.com"}
    assert hosts(allowed_hosts=["*"]) is None
    # bound off loopback: the bound name or address too
    assert hosts(host="10.1.2.3") == loopback | {"10.1.2.3"}
    assert hosts(host="reef.internal") == loopback | {"reef.internal"}
    assert hosts(host="fd00::1") == loopback | {"[fd00::1]"}
    # a wildcard bind is reached by names it cannot know: any, unless allowed_hosts pins them
    assert hosts(host="0.0.0.0") is None
    assert hosts(host="::", allowed_hosts=["reef.example.com"]) == loopback | {"reef.example.com"}
    with pytest.raises(Exception, match="not a host name"):
        hosts(allowed_hosts=["https://reef.example.com"])


def test_allowed_hosts_are_answered(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with InProcessReef(
        tmp_path, server={"allowed_hosts": ["reef.example.com", "*.corp.example"]}
    ) as srv:
        for host, status in [
            ("reef.example.com", 200),
            ("reef.example.com:443", 200),
            ("a.b.corp.example", 200),
            ("corp.example", 421),
            ("evil.example", 421),
        ]:
            r = httpx.get(f"{srv.url}/v1/models", headers={"Host": host})
            assert r.status_code == status, host
        ok = httpx.post(
            f"{srv.url}/v1/chat/completions",
            json=CHAT,
            headers={"Host": "reef.example.com", "Origin": "https://reef.example.com"},
        )
        assert ok.status_code == 200, ok.text
