"""The real pi coding agent, installed by Reef's install script into a throwaway HOME, runs
non-interactively (`pi -p`) against `reef serve`: its calls are recorded in the scenario with
the harness release that served them, `reef-pi report` reports on its last session, and after
a new harness release `reef-pi update` installs it and the next run is served by it;
`reef-pi evolve "<ask>"` turns an instruction into a candidate that waits for review.

Needs Node.js >= 20.6 and npm (the install fetches the pinned pi from the npm registry). The
whole round trip (a real `reef serve` with its evolve worker) is a `loop` test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reef.cli.testing import InProcessReef
from reef.models import resolve_model
from reef.testing.process import ReefServer

S = "pi-agent"
RULES_1 = "Reef rule one: always answer in French."
RULES_2 = "Reef rule two: always answer in Italian."
ASK = "when I ask you to fix a bug, reproduce it with a failing test first"


@pytest.fixture(scope="module")
def pi_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReefServer]:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail("these tests need Node.js >= 20.6 and npm on PATH")
    # pi's own system prompt is ~3.3k tokens of the tiny model's small vocabulary: serve the
    # tiny model with a longer context (same weights; rotary positions have no parameters)
    tiny = resolve_model("tiny", Path.home() / ".cache" / "reef" / "models")
    model = tmp_path_factory.mktemp("model") / "tiny8k"
    shutil.copytree(tiny, model)
    config = json.loads((model / "config.json").read_text())
    config["max_position_embeddings"] = 8192
    (model / "config.json").write_text(json.dumps(config))
    # with the evolve worker: `reef-pi evolve` asks it for a harness change (POST /reef/train)
    with ReefServer(
        tmp_path_factory.mktemp("reef-pi"),
        "--model",
        str(model),
        env={"REEF_REEF__AUTO": "true"},
    ) as srv:
        yield srv


def _harness(server: ReefServer, rules: str) -> str:
    r = httpx.post(
        f"{server.url}/reef/scenarios/{S}/harness",
        json={
            "files": {
                "AGENTS.md": rules,
                "skills/cite/SKILL.md": "---\nname: cite\ndescription: Cites sources.\n---\nCite.\n",
                "prompts/review.md": "Review this change.\n",
            }
        },
        timeout=60,
    )
    assert r.status_code == 201, r.text
    return str(r.json()["release_id"])


def _run(cmd: list[str], home: Path, cwd: Path, stdin: str | None = None) -> str:
    env = {  # the machine's environment (network, CA files) with a throwaway HOME
        **{k: v for k, v in os.environ.items() if not k.startswith(("PI_", "REEF_"))},
        "HOME": str(home),
        "PATH": f"{home / '.reef-pi' / 'bin'}:{os.environ['PATH']}",
        "PI_OFFLINE": "1",  # no version checks against the network
        "NO_COLOR": "1",
    }
    # npm's own settings (registry, CA file, node headers) are the machine's, not the HOME's
    npmrc = Path(os.environ.get("NPM_CONFIG_USERCONFIG", Path.home() / ".npmrc"))
    if npmrc.is_file():
        env["NPM_CONFIG_USERCONFIG"] = str(npmrc)
    out = subprocess.run(
        cmd, input=stdin, capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )
    assert out.returncode == 0, f"{cmd}: {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out.stdout + out.stderr


@pytest.mark.loop
def test_pi_installed_by_the_script_is_served_and_updated(
    pi_server: ReefServer, tmp_path: Path
) -> None:
    first = _harness(pi_server, RULES_1)
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    script = httpx.get(
        f"{pi_server.url}/reef/harness/install",
        params={"adapter": "pi", "scenario": S, "max_tokens": 16},
    )
    assert script.status_code == 200 and script.text.startswith("#!/bin/sh")
    assert (
        "REEF_API_KEY" in script.text and "Bearer" not in script.text.split("REEF_AGENT_MJS_END")[0]
    )

    out = _run(["sh", "-s"], home, project, stdin=script.text)
    assert f"installed release {first}" in out, out
    agent = home / ".pi" / "agent"
    assert (agent / "AGENTS.md").read_text() == RULES_1
    assert (agent / "skills" / "cite" / "SKILL.md").is_file()
    assert (agent / "prompts" / "review.md").is_file()
    provider = json.loads((agent / "models.json").read_text())["providers"]["reef"]
    assert provider["baseUrl"] == f"{pi_server.url}/v1"
    assert provider["headers"]["x-reef-scenario"] == S
    installed = json.loads((home / ".reef-pi" / "installed.json").read_text())
    assert installed["release_id"] == first

    # nothing new: says so, changes nothing
    before = {
        p: p.stat().st_mtime_ns
        for p in (home / ".reef-pi").rglob("*")
        if p.is_file() and "node_modules" not in p.parts
    }
    again = _run(["sh", "-s"], home, project, stdin=script.text)
    assert "nothing new" in again, again
    after = {p: p.stat().st_mtime_ns for p in before}
    assert after == before

    # pi runs against Reef; its calls are recorded with the release that served them
    _run(["pi", "-p", "Say hi."], home, project)
    session = (home / ".reef-pi" / "last-session").read_text().strip()
    turns = httpx.get(f"{pi_server.url}/reef/scenarios/{S}/sessions/{session}").json()["data"]
    assert turns and all(t["release_id"] == first for t in turns)
    system = turns[0]["request"]["messages"][0]
    assert system["role"] == "system" and RULES_1 in json.dumps(system)

    out = _run(["reef-pi", "report", "--score", "1", "--feedback", "good"], home, project)
    assert f"reported on {len(turns)} receipts" in out, out

    # a new harness release: reef-pi update installs it, and the next run is served by it
    second = _harness(pi_server, RULES_2)
    out = _run(["reef-pi", "update"], home, project)
    assert f"installed release {second}" in out, out
    assert (agent / "AGENTS.md").read_text() == RULES_2
    _run(["pi", "-p", "Say hi again."], home, project)
    session = (home / ".reef-pi" / "last-session").read_text().strip()
    turns = httpx.get(f"{pi_server.url}/reef/scenarios/{S}/sessions/{session}").json()["data"]
    assert turns and all(t["release_id"] == second for t in turns)
    assert RULES_2 in json.dumps(turns[0]["request"]["messages"][0])

    # an instruction in plain language: the worker makes a candidate that waits for review;
    # once an admin promotes it, reef-pi update installs it
    out = _run(["reef-pi", "evolve", ASK], home, project)
    assert "waits for review" in out, out
    cand = httpx.get(
        f"{pi_server.url}/reef/scenarios/{S}/candidates", params={"status": "pending"}
    ).json()["data"][0]
    assert cand["operation"] == "harness" and cand["recipe"] == "instruct"
    r = httpx.post(
        f"{pi_server.url}/reef/scenarios/{S}/promote",
        json={"release_id": cand["release_id"]},
        timeout=60,
    )
    assert r.status_code == 201, r.text
    out = _run(["reef-pi", "update"], home, project)
    assert f"installed release {cand['release_id']}" in out, out
    rules = (agent / "AGENTS.md").read_text()
    assert rules.startswith(RULES_2) and f"## Instructions\n- {ASK}" in rules


def test_the_install_root_may_not_be_inside_the_project(
    server: InProcessReef, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    script = httpx.get(
        f"{server.url}/reef/harness/install", params={"adapter": "pi", "scenario": S}
    )
    env = {**os.environ, "HOME": str(tmp_path), "REEF_AGENT_ROOT": str(project / ".reef-pi")}
    out = subprocess.run(
        ["sh", "-s"], input=script.text, capture_output=True, text=True, env=env, cwd=project
    )
    assert out.returncode != 0 and "inside the git project" in out.stderr
    r = httpx.get(f"{server.url}/reef/harness/install", params={"adapter": "vscode", "scenario": S})
    assert r.status_code == 404
