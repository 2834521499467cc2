"""The shipped configurations and example applications work as their headers say: every
recipe's `recipes/<name>/examples/serve.yaml` (and every example's) loads with the settings
model and its recipe takes its params; the three applications in examples/ run, as a user
runs them, against a Reef serving the tiny model, and leave in it what they promise."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reef.cli.main import parser
from reef.cli.testing import InProcessReef
from reef.client import Reef
from reef.recipe import RECIPES, import_object, load_recipe
from reef.settings import load_settings
from reef.wire import ReportOut

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(
    [*ROOT.glob("recipes/**/examples/**/serve.yaml"), *ROOT.glob("examples/*/serve.yaml")]
)


def test_every_built_in_recipe_has_an_example() -> None:
    for name in RECIPES:
        assert (ROOT / "recipes" / name / "examples" / "serve.yaml").is_file(), name
    # the command the design guide gives for SAO, as typed
    assert (ROOT / "recipes/sao/examples/sao/serve.yaml").is_file()


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_example_config_loads(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(config.parent))  # the verifier example's own module
    for overrides in ({}, {"engine": {"model": "tiny"}}):  # as typed, and with --model tiny
        settings = load_settings(config, **overrides)
        recipe = load_recipe(settings.reef.recipe, settings.reef.params)
        where = config.relative_to(ROOT).parts
        if where[0] == "recipes":  # recipes/<name>/examples/...: that recipe's
            assert recipe.name == where[1]
        if settings.gate.scorer:
            assert callable(import_object(settings.gate.scorer, "gate.scorer"))
        reward = getattr(recipe.params, "reward", None)
        if reward:
            assert callable(recipe.scorer())


def test_the_arithmetic_verifier_scores_answers() -> None:
    sys.path.insert(0, str(ROOT / "examples/verifier_task"))
    try:
        from arithmetic import reward
    finally:
        sys.path.remove(str(ROOT / "examples/verifier_task"))
    prompts = [
        [{"role": "user", "content": "What is 6 * 7? Answer with the number only."}],
        "What is 10 - 12? Answer with the number only.",
    ]
    completions = [[{"role": "assistant", "content": "42"}], "It is -3."]
    assert reward(completions, prompts=prompts) == [1.0, 0.0]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    with InProcessReef(tmp_path_factory.mktemp("reef-examples")) as srv:
        yield srv


def run(app: str, server: InProcessReef, *args: str) -> str:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / app / "app.py"), "--base-url", server.url, *args],
        cwd=ROOT / "examples" / app,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_chat_thumbs(server: InProcessReef) -> None:
    out = run("chat_thumbs", server, "--rounds", "3", "--scenario", "ex-thumbs")
    assert out.count("Q: ") == 3 and out.count("   thumbs ") == 3
    with Reef(server.url, scenario="ex-thumbs") as reef:
        records = reef.records().data
        reports = {r.references[0]: r for r in _reports(server, "ex-thumbs")}
    assert len(records) == 3 and set(reports) == {r.id for r in records}
    assert {r.score for r in reports.values()} <= {0.0, 1.0}
    assert all(r.id == f"thumb-{ref}" for ref, r in reports.items())


def test_agent_reactions(server: InProcessReef) -> None:
    out = run("agent_reactions", server, "--turns", "3", "--scenario", "ex-agent")
    assert out.count("agent: ") == 3
    assert out.strip().splitlines()[-1].endswith("turns [0, 1, 2]")
    assert _reports(server, "ex-agent") == []  # the next turns are the signal, not reports


def test_verifier_task(server: InProcessReef) -> None:
    out = run("verifier_task", server, "--tasks", "3", "--scenario", "ex-verifier")
    assert "every answer reported with its score" in out
    reports = _reports(server, "ex-verifier")
    assert len(reports) == 3 and all(r.score in (0.0, 1.0) for r in reports)
    assert all(r.metadata["verifier"] == "arithmetic" for r in reports)


def _reports(server: InProcessReef, scenario: str) -> list[ReportOut]:
    with Reef(server.url, scenario=scenario) as reef:
        return reef.reports().data


def _header_commands(config: Path) -> list[list[str]]:
    """The `reef serve -c ...` lines in a config's header comment, as argument lists; an
    optional `[--model tiny]` gives both forms."""
    commands = []
    for line in config.read_text().splitlines():
        text = line.lstrip("# ").split("  #")[0].strip()
        if not text.startswith("reef serve "):
            continue
        base = text.replace("[--model tiny]", "").split()
        commands.append(base[1:])
        if "[--model tiny]" in text:
            commands.append([*base[1:], "--model", "tiny"])
    return commands


RECIPE_CONFIGS = sorted(ROOT.glob("recipes/**/examples/**/serve.yaml"))


@pytest.mark.parametrize("config", RECIPE_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_header_command_serves_as_typed(
    config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every shipped recipe config's header says how to serve it; that command, typed from the
    repository's root, parses with `reef`'s own parser, and a server on that file answers a
    chat call with a receipt (on the tiny model: SmolLM2 is the same path, a bigger load)."""
    monkeypatch.chdir(ROOT)
    commands = _header_commands(config)
    assert commands, f"{config.relative_to(ROOT)} names no `reef serve -c` command"
    for argv in commands:
        args = parser().parse_args(argv)
        assert args.command == "serve" and args.config.resolve() == config
    with InProcessReef(tmp_path, config=config.relative_to(ROOT)) as srv:
        answer = httpx.post(
            f"{srv.base_url}/chat/completions",
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
            },
            headers={"x-reef-scenario": "typed"},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        receipt = answer.headers["x-reef-agent-record-id"]
        with Reef(srv.url, scenario="typed") as reef:
            assert [r.id for r in reef.records().data] == [receipt]
