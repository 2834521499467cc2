"""The `reef` command as a newcomer meets it: --version, --help on every command and flag,
shell completion, `reef report` against a running server, `reef config`, and the clean
one-line failures of `reef export` and `reef report`."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import yaml

import reef
from reef.cli.main import FLAG_SETTINGS, env_var, main, parser
from reef.cli.testing import InProcessReef

ROOT = Path(__file__).resolve().parents[2]


def reef_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`reef ARGS` in a process of its own, as a shell runs it."""
    return subprocess.run(
        [sys.executable, "-m", "reef.cli.main", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


def commands() -> dict[str, argparse.ArgumentParser]:
    (sub,) = (a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_version_and_help_list_every_command() -> None:
    out = reef_cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"reef {reef.__version__}"
    help_text = reef_cli("--help").stdout
    description = " ".join(parser().description.split())
    names = set(commands())
    assert {"serve", "rollout", "openapi", "report", "config", "completion"} <= names
    for name in names:
        assert f"\n    {name} " in help_text, f"`reef --help` does not list {name}"
        assert f"reef {name}" in description or f"|{name}" in description, name


def test_every_flag_has_help_naming_the_environment_variable_it_reads() -> None:
    for name, command in commands().items():
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"reef {name} {action.option_strings or action.dest}: no help"
            if action.dest in FLAG_SETTINGS:
                assert f"(env {env_var(FLAG_SETTINGS[action.dest])})" in action.help
            if action.dest == "token":
                assert "env REEF_API_KEY" in action.help
    assert env_var(("engine", "upstream", "api_key")) == "REEF_ENGINE__UPSTREAM__API_KEY"
    serve_help = reef_cli("serve", "--help").stdout
    assert "(env REEF_SERVER__PORT)" in serve_help and "(env REEF_STORE__DATABASE_URL)" in " ".join(
        serve_help.split()
    )


def test_bash_completion_completes_commands_and_flags(tmp_path: Path) -> None:
    script = tmp_path / "reef.bash"
    out = reef_cli("completion", "bash")
    assert out.returncode == 0
    script.write_text(out.stdout)
    probe = (
        f"source {script}\n"
        'complete_words() { COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _shtab_reef; '
        'echo "${COMPREPLY[*]}"; }\n'
        "complete_words reef rol\n"
        "complete_words reef completion ''\n"
        "complete_words reef report --rep\n"
    )
    done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == ["rollback rollout", "bash zsh", "--report-id"]


def test_zsh_completion_is_a_compdef_of_every_command() -> None:
    out = reef_cli("completion", "zsh")
    assert out.returncode == 0 and out.stdout.startswith("#compdef reef")
    for name in commands():
        assert f"\n    {name}:'" in out.stdout
    if shutil.which("zsh"):
        subprocess.run(["zsh", "-n"], input=out.stdout, text=True, check=True)


def test_export_refuses_an_extension_it_does_not_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "records.csv"
    args = ["export", "--scenario", "s", "--output", str(out), "--state-dir", str(tmp_path)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "'.csv'" in err and ".jsonl" in err and ".parquet" in err and "--format" in err
    assert not out.exists() and not (tmp_path / "reef.db").exists()


def test_config_prints_the_effective_settings_with_secrets_masked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "serve.yaml"
    sha = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"
    config.write_text(
        yaml.safe_dump(
            {
                "store": {"database_url": "postgresql+psycopg://reef:hunter2@db:5432/reef"},
                "auth": {"tokens": [{"name": "ops", "sha256": sha, "admin": True}]},
                "artifacts": {"url": "s3://AKIAEXAMPLE:s3-secret-key@bucket/prefix"},
                "engine": {"vllm": {"args": ["--api-key", "vllm-key", "--dtype", "float32"]}},
                "reef": {"recipe": "openclaw", "engine_token": "engine-token-value"},
            }
        )
    )
    monkeypatch.setenv("REEF_ENGINE__UPSTREAM__API_KEY", "sk-upstream-key")
    monkeypatch.setenv("REEF_SERVER__LOG_LEVEL", "debug")
    assert main(["config", "-c", str(config), "--port", "9123"]) == 0
    text = capsys.readouterr().out
    for secret in (sha, "hunter2", "s3-secret-key", "vllm-key", "engine-token-value", "sk-up"):
        assert secret not in text
    shown = yaml.safe_load(text)
    assert shown["server"]["port"] == 9123 and shown["server"]["log_level"] == "debug"
    assert shown["reef"]["recipe"] == "openclaw"
    assert shown["store"]["database_url"] == "postgresql+psycopg://reef:**********@db:5432/reef"
    assert shown["artifacts"]["url"] == "s3://AKIAEXAMPLE:**********@bucket/prefix"
    assert shown["auth"]["tokens"][0] == {**shown["auth"]["tokens"][0], "name": "ops"}
    assert shown["auth"]["tokens"][0]["sha256"] == "**********"
    assert shown["engine"]["vllm"]["args"] == ["--api-key", "**********", "--dtype", "float32"]
    assert shown["engine"]["upstream"]["api_key"] == "**********"
    assert shown["reef"]["engine_token"] == "**********"


def test_a_bad_config_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text("server: {port: many}\n")
    assert main(["config", "-c", str(config)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "server.port" in err


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessReef]:
    with InProcessReef(tmp_path_factory.mktemp("reef-cli")) as srv:
        yield srv


def receipt(server: InProcessReef, scenario: str) -> str:
    chat = openai.OpenAI(
        base_url=server.base_url, api_key="unused", default_headers={"x-reef-scenario": scenario}
    )
    raw = chat.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    return raw.headers["x-reef-agent-record-id"]


def test_report(server: InProcessReef, capsys: pytest.CaptureFixture[str]) -> None:
    ref = receipt(server, "cli-report")
    base = ["report", ref, "--url", server.url, "--scenario", "cli-report"]
    args = [*base, "--score", "1", "--feedback", '{"correction": "Hello."}', "--report-id", "c1"]
    assert main(args) == 0
    assert capsys.readouterr().out.strip() == (
        "reef: report c1 on 1 receipt of 'cli-report' stored"
    )
    assert main([*args, "--json"]) == 0
    stored = json.loads(capsys.readouterr().out)
    assert stored["created"] is False and stored["feedback"] == {"correction": "Hello."}
    assert main([*base, "--feedback", "too long", "--metadata", '{"by": "cli"}', "--json"]) == 0
    text = json.loads(capsys.readouterr().out)
    assert text["feedback"] == "too long" and text["metadata"] == {"by": "cli"}

    # expected failures: one line on stderr, exit 1
    assert main([*base[:1], "rec_nope", *base[2:], "--score", "1"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "400 unknown_reference" in err and "rec_nope" in err
    assert main([*base, "--score", "1", "--report-id", "c1"]) == 1
    assert "409" in capsys.readouterr().err
    assert main(base) == 1
    assert "needs a score, feedback, or both" in capsys.readouterr().err


def test_an_unreachable_server_is_one_line_and_no_traceback() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = reef_cli("report", "rec_x", "--score", "1", "--url", f"http://127.0.0.1:{port}")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "unreachable" in out.stderr
    out = reef_cli("releases", "--scenario", "s", "--url", f"http://127.0.0.1:{port}")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "unreachable" in out.stderr
