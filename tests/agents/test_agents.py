"""The real coding agents Reef installs — Codex, Claude Code, opencode — each installed by the
script Reef serves into a throwaway HOME, run non-interactively (`codex exec`, `claude -p`,
`opencode run`) against a real `reef serve` on the tiny model: their calls are recorded in the
scenario with the harness release that served them, the released rules are in what the model
was shown, `reef-<agent> report` reports on the run's receipts, and after a new release
`reef-<agent> update` installs it and the next run is served by it.

The agents are the pinned npm packages `make agents` installs into .agents/ (the project's own
folder, not a global install); the test links them into the install root, so the served script
finds its pinned version there and does not fetch it again. Marked `agents` (`make
test-agents`): they need Node.js, those packages, and minutes of CPU (each agent's own system
prompt and tool list is 30-80 kB of text for the tiny model to read)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reef.api.routes.harness import AGENTS
from reef.models import resolve_model
from reef.testing.process import ReefServer

# Minutes per agent on a busy 2-core machine (Claude Code's ~29k-token prompt, four calls a run).
pytestmark = [pytest.mark.agents, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
INSTALLED = ROOT / ".agents"  # `make agents`: one npm prefix per agent
RULES_1 = "Reef rule one: always answer in French."
RULES_2 = "Reef rule two: always answer in Italian."
HARNESS = {
    "skills/cite/SKILL.md": "---\nname: cite\ndescription: Cites sources.\n---\nCite.\n",
    "prompts/review.md": "Review this change.\n",
}
# How each agent runs one prompt non-interactively, and where its harness lands in HOME.
RUN = {
    "codex": ["codex", "exec", "--skip-git-repo-check", "Say hi."],
    "claude-code": ["claude", "-p", "Say hi."],
    "opencode": ["opencode", "run", "Say hi."],
}
PLACES = {
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


@pytest.fixture(scope="module")
def agent_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReefServer]:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail("these tests need Node.js >= 20.6 and npm on PATH")
    # The agents' own prompts are long (Claude Code's system prompt and tools: ~80 kB, ~40k
    # tokens of the tiny model's small vocabulary): the tiny model with a long context (same
    # weights; rotary positions have no parameters)
    tiny = resolve_model("tiny", Path.home() / ".cache" / "reef" / "models")
    model = tmp_path_factory.mktemp("model") / "tiny"
    shutil.copytree(tiny, model)
    for name, key in (
        ("config.json", "max_position_embeddings"),
        ("tokenizer_config.json", "model_max_length"),
    ):
        config = json.loads((model / name).read_text())
        config[key] = 131072
        (model / name).write_text(json.dumps(config))
    state = tmp_path_factory.mktemp("reef-agents")
    (state / "serve.yaml").write_text(
        "server:\n  max_tokens_cap: 32000\n  max_body_bytes: 16777216\n"
        "engine:\n  default_max_tokens: 8\n"
    )
    with ReefServer(state, "-c", str(state / "serve.yaml"), "--model", str(model)) as srv:
        yield srv


def _harness(server: ReefServer, scenario: str, rules: str) -> str:
    r = httpx.post(
        f"{server.url}/reef/scenarios/{scenario}/harness",
        json={"files": {"AGENTS.md": rules, **HARNESS}},
        timeout=60,
    )
    assert r.status_code == 201, r.text
    return str(r.json()["release_id"])


def _run(
    cmd: list[str], home: Path, root: Path, cwd: Path, stdin: str | None = None, check: bool = True
) -> str:
    env = {  # the machine's environment (network, CA files) with a throwaway HOME
        **{
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("REEF_", "ANTHROPIC_", "OPENAI_", "CODEX_", "OPENCODE", "XDG_"))
        },
        "HOME": str(home),
        "PATH": f"{root / 'bin'}:{os.environ['PATH']}",
        "NO_COLOR": "1",
    }
    npmrc = Path(os.environ.get("NPM_CONFIG_USERCONFIG", Path.home() / ".npmrc"))
    if npmrc.is_file():
        env["NPM_CONFIG_USERCONFIG"] = str(npmrc)
    out = subprocess.run(
        cmd, input=stdin, capture_output=True, text=True, env=env, cwd=cwd, timeout=600
    )
    assert out.returncode == 0 or not check, f"{cmd}: {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out.stdout + out.stderr


def _session_records(server: ReefServer, scenario: str, root: Path) -> list[dict]:
    session = (root / "last-session").read_text().strip()
    r = httpx.get(f"{server.url}/reef/scenarios/{scenario}/sessions/{session}")
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


# pi's own round trip, through the same script (and its evolve ask), is tests/api/test_pi_install.py
@pytest.mark.parametrize("adapter", sorted(set(AGENTS) - {"pi"}))
def test_the_agent_is_installed_served_reported_and_updated(
    agent_server: ReefServer, adapter: str, tmp_path: Path
) -> None:
    agent = AGENTS[adapter]
    prefix = INSTALLED / adapter
    if not (prefix / "node_modules" / agent.package / "package.json").is_file():
        pytest.fail(f"{agent.package}@{agent.version} is not in {prefix}: run `make agents`")
    scenario = f"agent-{adapter}"
    first = _harness(agent_server, scenario, RULES_1)
    home, project = tmp_path / "home", tmp_path / "project"
    root = home / f".reef-{adapter}"
    (root).mkdir(parents=True)
    project.mkdir()
    (root / "agent").symlink_to(prefix, target_is_directory=True)
    script = httpx.get(
        f"{agent_server.url}/reef/harness/install",
        params={
            "adapter": adapter,
            "scenario": scenario,
            "max_tokens": 8,
            "context_window": 131072,
        },
    )
    assert script.status_code == 200 and script.text.startswith("#!/bin/sh")
    assert (
        "REEF_API_KEY" in script.text and "Bearer" not in script.text.split("REEF_AGENT_MJS_END")[0]
    )

    out = _run(["sh", "-s"], home, root, project, stdin=script.text)
    assert f"installed release {first}" in out, out
    rules, skill, prompt = (home / p for p in PLACES[adapter])
    assert rules.read_text() == RULES_1 and skill.is_file() and prompt.is_file()
    _check_provider(adapter, home, agent_server, scenario)

    # nothing new: says so, changes nothing
    before = {p: p.stat().st_mtime_ns for p in (root, home / PLACES[adapter][0]) if p.is_file()}
    before |= {p: p.stat().st_mtime_ns for p in root.glob("*") if p.is_file()}
    again = _run(["sh", "-s"], home, root, project, stdin=script.text)
    assert "nothing new" in again, again
    assert {p: p.stat().st_mtime_ns for p in before} == before

    # the agent runs against Reef: its calls are in the scenario with the release that served
    # them. The tiny model's answers are noise that runs into max_tokens, which Codex and
    # Claude Code report as a failed turn (exit 1): what is checked is what Reef recorded.
    _run(RUN[adapter], home, root, project, check=False)
    turns = _session_records(agent_server, scenario, root)
    assert turns and all(t["release_id"] == first for t in turns)
    assert all(t["route"] == _route(adapter) for t in turns)
    # the released rules, as the model saw them (opencode's first call names the session: a
    # side call with a prompt of its own)
    assert any(RULES_1 in json.dumps(t["request"]) for t in turns)

    out = _run(
        [f"reef-{adapter}", "report", "--score", "1", "--feedback", "good"], home, root, project
    )
    assert f"reported on {len(turns)} receipts" in out, out
    reports = httpx.get(f"{agent_server.url}/reef/scenarios/{scenario}/reports").json()["data"]
    assert set(reports[0]["references"]) == {t["id"] for t in turns}

    # a new harness release: update installs it, and the next run is served by it
    second = _harness(agent_server, scenario, RULES_2)
    out = _run([f"reef-{adapter}", "update"], home, root, project)
    assert f"installed release {second}" in out, out
    assert rules.read_text() == RULES_2
    _run(RUN[adapter], home, root, project, check=False)
    turns = _session_records(agent_server, scenario, root)
    assert turns and all(t["release_id"] == second for t in turns)
    assert any(RULES_2 in json.dumps(t["request"]) for t in turns)
    status = json.loads(_run([f"reef-{adapter}", "status"], home, root, project))
    assert status["release_id"] == second and status["agent"] == adapter


def _route(adapter: str) -> str:
    return {"codex": "responses", "claude-code": "messages", "opencode": "chat.completions"}[
        adapter
    ]


def _check_provider(adapter: str, home: Path, server: ReefServer, scenario: str) -> None:
    """The agent's own configuration names Reef, the scenario and the session header."""
    if adapter == "codex":
        toml = (home / ".codex" / "config.toml").read_text()
        assert "[model_providers.reef]" in toml and 'wire_api = "responses"' in toml
        assert f'base_url = "{server.url}/v1"' in toml
        assert re.search(rf'"x-reef-scenario" = "{scenario}"', toml)
        assert '"x-reef-session-id" = "REEF_SESSION"' in toml
    elif adapter == "opencode":
        config = json.loads((home / ".config" / "opencode" / "opencode.json").read_text())
        reef = config["provider"]["reef"]
        assert reef["options"]["baseURL"] == f"{server.url}/v1"
        assert reef["options"]["headers"]["x-reef-scenario"] == scenario
    else:  # Claude Code: its wrapper's environment
        wrapper = (home / ".reef-claude-code" / "bin" / "claude").read_text()
        assert f'ANTHROPIC_BASE_URL="{server.url}"' in wrapper
        assert "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1" in wrapper
        assert f"x-reef-scenario: {scenario}" in wrapper
