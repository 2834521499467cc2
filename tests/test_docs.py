"""The docs say what the code does: the configuration and CLI references are the ones the code
generates now (cli.docs), every settings key and every flag has a description worth a row,
and no committed doc sends a reader to a file a clone of this repository does not have."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from reef.cli import docs
from reef.cli.main import parser
from reef.settings import Settings, load_settings, secret_keys

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *ROOT.glob("docs/*.md")])


@pytest.mark.parametrize("path", [docs.CONFIGURATION, docs.CLI], ids=lambda p: p.name)
def test_the_generated_reference_is_current(path: Path) -> None:
    render = docs.configuration if path == docs.CONFIGURATION else docs.cli
    assert path.is_file(), f"{path.name} is missing: run `{docs.COMMAND}`"
    assert path.read_text() == render(), (
        f"docs/{path.name} differs from what the code generates: run `{docs.COMMAND}` "
        "(make docs) and commit the result"
    )


def test_the_check_mode_names_the_command(tmp_path: Path) -> None:
    """`python -m reef.cli.docs --check` passes on the committed files, and on a stale copy fails
    naming the file and the command that fixes it (the copy: the repository is not touched)."""

    def check(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "reef.cli.docs", *args]
        return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)

    ok = check("--check")
    assert ok.returncode == 0, ok.stderr
    written = check("--dir", str(tmp_path))
    assert written.returncode == 0 and check("--check", "--dir", str(tmp_path)).returncode == 0
    (tmp_path / "reef.cli.md").write_text((tmp_path / "reef.cli.md").read_text() + "hand edit\n")
    out = check("--check", "--dir", str(tmp_path))
    assert out.returncode == 1
    assert out.stderr == f"{tmp_path / 'reef.cli.md'} is stale: run `python -m reef.cli.docs`\n"


def test_every_settings_section_and_key_is_in_the_reference() -> None:
    text = docs.CONFIGURATION.read_text()
    for section in docs.sections():
        assert f"## `{section.path}`" in text
        assert section.model.__doc__, f"settings section {section.path} has no docstring"
        for key, field in section.model.model_fields.items():
            if docs._models_in(field.annotation) and not field.description:
                assert field.annotation is not None
                continue  # a section of its own: its table describes it
            assert field.description and len(field.description) > 8, (
                f"{section.path}.{key} has no description: add Field(description=...) in "
                "reef/settings"
            )


@pytest.mark.parametrize(
    ("name", "value", "check"),
    [
        ("REEF_SERVER__PORT", "9123", lambda s: s.server.port == 9123),
        (
            "REEF_ENGINE__EMBEDDED__MAX_BATCH_SIZE",
            "3",
            lambda s: s.engine.embedded.max_batch_size == 3,
        ),
        ("REEF_ROLLOUT__SHADOW__SAMPLE", "0.5", lambda s: s.rollout.shadow.sample == 0.5),
        (
            "REEF_ENGINE__VLLM__ARGS",
            '["--dtype", "float32"]',
            lambda s: s.engine.vllm.args[1] == "float32",
        ),
    ],
)
def test_the_environment_variables_the_reference_names_set_their_keys(
    name: str, value: str, check: Callable[[Settings], bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert f"`{name}`" in docs.CONFIGURATION.read_text()
    monkeypatch.setenv(name, value)
    assert check(load_settings())


def test_the_reference_covers_every_top_level_section() -> None:
    paths = {s.path for s in docs.sections()}
    # a map of sections (scenarios) is its entries' section, `scenarios.<name>`
    assert set(Settings.model_fields) <= paths | {p.removesuffix(".<name>") for p in paths}


def _actions(p: argparse.ArgumentParser, where: str) -> list[tuple[str, argparse.Action]]:
    out = []
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _actions(sub, f"{where} {name}")
        elif not isinstance(action, argparse._HelpAction):
            out.append((where, action))
    return out


def test_every_flag_has_help() -> None:
    """Every argument of every command says what it is; `--help` and docs/cli.md show it."""
    actions = _actions(parser(), "reef")
    assert len(actions) > 60
    for where, action in actions:
        name = "/".join(action.option_strings) or action.dest
        assert action.help and action.help.strip(), f"`{where} {name}` has no help text"
        assert action.help != action.dest.replace("_", " "), f"`{where} {name}`: help is its name"


def test_the_cli_reference_names_the_environment_each_setting_flag_reads() -> None:
    text = docs.CLI.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `--port` | `PORT` | port"))
    assert "`server.port`" in row and "`REEF_SERVER__PORT`" in row
    report_url = [line for line in text.splitlines() if "`REEF_BASE_URL`" in line]
    assert report_url, "reef report --url reads REEF_BASE_URL (reef.client)"


# A file outside this repository (a clone does not have it), or a numbered section of one.
OUTSIDE = re.compile(r"\.\./shared|ALGORITHMS\.md|DESIGN\.md|§\s?\d")


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_doc_cites_a_file_outside_the_repository(path: Path) -> None:
    hits = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not hits, "cites a file a clone does not have:\n" + "\n".join(hits)


def test_relative_links_in_the_docs_resolve() -> None:
    """Every relative markdown link in the README and docs/ names a file of the repository."""
    broken = []
    for path in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (path.parent / target).exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, "\n".join(broken)


def test_the_reference_does_not_depend_on_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Generated from the models' defaults, not from settings loaded here: a REEF_* variable
    where it runs changes nothing."""
    before = docs.configuration()
    monkeypatch.setenv("REEF_SERVER__PORT", "1")
    assert docs.configuration() == before


def test_the_readme_configuration_example_loads(tmp_path: Path) -> None:
    """The YAML under the README's Configuration heading is a settings file as it stands."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Configuration\n") :]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "serve.yaml"
    path.write_text(example)
    settings = load_settings(path)
    assert settings.engine.kind == "embedded" and settings.gate.policy == "improve"


def test_the_readme_names_every_secret_setting() -> None:
    """The Secrets paragraph lists exactly the settings typed SecretStr."""
    text = (ROOT / "README.md").read_text()
    paragraph = text[text.index("### Secrets\n") :].split("\nare secrets", 1)[0]
    named = set(re.findall(r"`([a-z_]+(?:\.[a-z_]+)+)`", paragraph))
    assert named == {".".join(k) for k in secret_keys()}


def test_every_flag_the_docs_show_exists() -> None:
    """`reef <command> --flag` anywhere in the docs and the shipped configs' headers names a
    flag that command takes (a renamed or removed flag fails here, not in a reader's shell)."""
    commands = docs._commands(parser())
    pattern = re.compile(r"reef (" + "|".join(commands) + r")\b([^`|#;]*)")
    files = [*DOCS, ROOT / "examples/README.md", *ROOT.glob("recipes/**/serve.yaml")]
    seen, unknown = 0, []
    for path in files:
        for line in path.read_text().splitlines():
            for m in pattern.finditer(line):
                seen += 1
                flags = set(commands[m.group(1)][0]._option_string_actions)
                for flag in re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", m.group(2)):
                    if flag not in flags:
                        unknown.append(f"{path.relative_to(ROOT)}: reef {m.group(1)} {flag}")
    assert seen > 100
    assert unknown == []
