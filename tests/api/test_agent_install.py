"""The install scripts for Codex, Claude Code and opencode (`/reef/harness/install?adapter=…`),
run with `sh` into a throwaway HOME at the configuration level: the agent's pinned package is
already in the install root (a package.json of the pinned version: the script then has nothing
to fetch), so what is checked is what the script and `reef-<agent> update` write — the harness
in the agent's places, Reef's provider in its configuration (other settings kept), the wrapper,
idempotence — and that it refuses to install inside a git project. The real agents run against
Reef in tests/agents (marker `agents`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from reef.api.routes.harness import AGENTS
from reef.cli.testing import InProcessReef

RULES = "Reef rule: answer in French."
FILES = {
    "AGENTS.md": RULES,
    "skills/cite/SKILL.md": "---\nname: cite\ndescription: Cites sources.\n---\nCite.\n",
    "prompts/review.md": "Review this change.\n",
}
PLACES = {
    "pi": (".pi/agent/AGENTS.md", ".pi/agent/skills/cite/SKILL.md", ".pi/agent/prompts/review.md"),
    "codex": (".codex/AGENTS.md", ".codex/skills/cite/SKILL.md", ".codex/prompts/review.md"),
    "claude-code": (
        ".claude/CLAUDE.md",
        ".claude/skills/cite/SKILL.md",
        ".claude/commands/review.md",
    ),
    "opencode": (
        ".config/opencode/AGENTS.md",
        ".config/opencode/skill/cite/SKILL.md",
        ".config/opencode/command/review.md",
    ),
}


def _script(server: InProcessReef, adapter: str, scenario: str) -> str:
    r = httpx.get(
        f"{server.url}/reef/harness/install",
        params={"adapter": adapter, "scenario": scenario},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return r.text


def _sh(script: str, home: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("REEF_", "XDG_", "CODEX_"))}
    return subprocess.run(
        ["sh", "-s"],
        input=script,
        capture_output=True,
        text=True,
        env={**keep, "HOME": str(home), **env},
        cwd=cwd,
        timeout=120,
    )


@pytest.mark.parametrize("adapter", sorted(AGENTS))
def test_the_script_installs_the_harness_and_the_provider(
    server: InProcessReef, scenario: str, adapter: str, tmp_path: Path
) -> None:
    if shutil.which("node") is None:
        pytest.fail("this test needs Node.js >= 20.6 on PATH")
    agent = AGENTS[adapter]
    r = httpx.post(
        f"{server.url}/reef/scenarios/{scenario}/harness", json={"files": FILES}, timeout=120
    )
    assert r.status_code == 201, r.text
    release = r.json()["release_id"]
    script = _script(server, adapter, scenario)
    assert f"PACKAGE='{agent.package}'" in script and f"VERSION='{agent.version}'" in script
    assert "REEF_API_KEY" in script and "Bearer" not in script.split("REEF_AGENT_MJS_END")[0]

    home, project = tmp_path / "home", tmp_path / "project"
    project.mkdir()
    _home_with_the_agent(home, adapter)

    out = _sh(script, home, project)
    assert out.returncode == 0, out.stderr
    assert f"installed release {release}" in out.stdout
    rules, skill, prompt = (home / p for p in PLACES[adapter])
    assert rules.read_text() == RULES and skill.read_text() == FILES["skills/cite/SKILL.md"]
    assert prompt.read_text() == FILES["prompts/review.md"]
    wrapper = (home / f".reef-{adapter}" / "bin" / agent.bin).read_text()
    assert "REEF_SESSION=" in wrapper and "last-session" in wrapper
    _assert_the_provider(adapter, home, wrapper, server.url, scenario)

    # idempotent: a rerun says so and writes nothing
    before = {p: p.stat().st_mtime_ns for p in home.rglob("*") if p.is_file()}
    again = _sh(script, home, project)
    assert again.returncode == 0 and "nothing new" in again.stdout, again.stdout + again.stderr
    assert {p: p.stat().st_mtime_ns for p in before} == before
    status = subprocess.run(
        [str(home / f".reef-{adapter}" / "bin" / f"reef-{adapter}"), "status"],
        capture_output=True,
        text=True,
        env={**os.environ, "HOME": str(home)},
        check=True,
    )
    assert json.loads(status.stdout)["release_id"] == release


def _home_with_the_agent(home: Path, adapter: str) -> None:
    """A HOME where the agent's pinned package is already in the install root (nothing to
    fetch), and the user's own settings for the agent, which the script must keep."""
    agent = AGENTS[adapter]
    prefix = home / f".reef-{adapter}" / "agent" / "node_modules"
    (prefix / agent.package).mkdir(parents=True)
    (prefix / agent.package / "package.json").write_text(json.dumps({"version": agent.version}))
    (prefix / ".bin").mkdir()
    (prefix / ".bin" / agent.bin).write_text("#!/bin/sh\nexit 0\n")
    (prefix / ".bin" / agent.bin).chmod(0o755)
    if adapter == "codex":  # the user's own settings stay
        (home / ".codex").mkdir(parents=True)
        (home / ".codex" / "config.toml").write_text(
            'model = "gpt-5"\n\n[tui]\nnotifications = true\n'
        )
    if adapter == "pi":  # the user's other providers stay
        (home / ".pi" / "agent").mkdir(parents=True)
        (home / ".pi" / "agent" / "models.json").write_text(
            json.dumps({"providers": {"other": {"baseUrl": "http://elsewhere/v1"}}})
        )
    if adapter == "opencode":
        (home / ".config" / "opencode").mkdir(parents=True)
        (home / ".config" / "opencode" / "opencode.json").write_text(
            json.dumps({"theme": "dark", "provider": {"other": {"name": "Other"}}})
        )


def _assert_the_provider(
    adapter: str, home: Path, wrapper: str, server_url: str, scenario: str
) -> None:
    """Reef's provider in the agent's configuration (the user's settings kept) or wrapper."""
    if adapter == "codex":
        config = (home / ".codex" / "config.toml").read_text()
        assert config.startswith('model = "gpt-5"\n\n[tui]\nnotifications = true\n')
        assert "[model_providers.reef]" in config and 'wire_api = "responses"' in config
        assert f'"x-reef-scenario" = "{scenario}"' in config
        profile = (home / ".codex" / "reef.config.toml").read_text()
        assert 'model_provider = "reef"' in profile and 'model = "tiny"' in profile
        assert "--profile reef" in wrapper
    elif adapter == "pi":
        models = json.loads((home / ".pi" / "agent" / "models.json").read_text())
        assert models["providers"]["other"] == {"baseUrl": "http://elsewhere/v1"}
        reef = models["providers"]["reef"]
        assert reef["baseUrl"] == f"{server_url}/v1" and reef["apiKey"] == "REEF_API_KEY"
        assert reef["headers"] == {
            "x-reef-scenario": scenario,
            "x-reef-session-id": "REEF_SESSION",
        }
        assert [m["id"] for m in reef["models"]] == ["tiny"]
        assert '--provider reef --model "tiny"' in wrapper
    elif adapter == "opencode":
        config = json.loads((home / ".config" / "opencode" / "opencode.json").read_text())
        assert config["theme"] == "dark" and "other" in config["provider"]
        reef = config["provider"]["reef"]
        assert reef["options"]["baseURL"] == f"{server_url}/v1"
        assert reef["options"]["headers"] == {
            "x-reef-scenario": scenario,
            "x-reef-session-id": "{env:REEF_SESSION}",
        }
        assert "tiny" in reef["models"]
    else:
        assert f'ANTHROPIC_BASE_URL="{server_url}"' in wrapper
        assert "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1" in wrapper
        assert f"x-reef-scenario: {scenario}" in wrapper


@pytest.mark.parametrize("adapter", sorted(AGENTS))
def test_the_install_root_may_not_be_inside_the_project(
    server: InProcessReef, scenario: str, adapter: str, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    out = _sh(
        _script(server, adapter, scenario),
        tmp_path,
        project,
        REEF_AGENT_ROOT=str(project / f".reef-{adapter}"),
    )
    assert out.returncode != 0 and "inside the git project" in out.stderr
