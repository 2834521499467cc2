"""Settings: defaults < YAML < REEF_* env < CLI flags; unknown keys are errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from reef.errors import ConfigError
from reef.settings import load_settings


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "serve.yaml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    s = load_settings()
    assert (s.server.host, s.server.port, s.engine.kind, s.engine.model) == (
        "127.0.0.1",
        8900,
        "embedded",
        "smollm2",
    )
    assert s.database_url == "sqlite:///.reef/reef.db"


def test_seed_example_is_accepted(tmp_path: Path) -> None:
    s = load_settings(
        _yaml(
            tmp_path,
            "reef:\n  recipe: recipes.sao.recipe:SAORecipe\n  batch_size: 1\n  max_staleness: 18\n",
        )
    )
    assert (s.reef.recipe, s.reef.batch_size, s.reef.max_staleness) == (
        "recipes.sao.recipe:SAORecipe",
        1,
        18,
    )


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("reef:\n  recpie: sft\n", "unknown key 'reef.recpie'"),
        ("colour: blue\n", "unknown key 'colour'"),
        ("reef:\n  batch_size: 0\n", "reef.batch_size"),
        ("reef:\n  max_staleness: -1\n", "reef.max_staleness"),
        ("reef:\n  recipe: not a recipe\n", "reef.recipe"),
        ("server:\n  port: lots\n", "server.port"),
        ("- a list\n", "mapping"),
        ("server: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_config_names_the_problem(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(_yaml(tmp_path, text))
    assert needle in err.value.message


def test_precedence_yaml_env_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _yaml(
        tmp_path, "server:\n  port: 9001\n  default_scenario: fromyaml\nreef:\n  batch_size: 4\n"
    )
    assert load_settings(config).server.port == 9001
    monkeypatch.setenv("REEF_SERVER__PORT", "9002")
    monkeypatch.setenv("REEF_REEF__MAX_STALENESS", "3")
    s = load_settings(config)
    assert (s.server.port, s.server.default_scenario, s.reef.batch_size, s.reef.max_staleness) == (
        9002,
        "fromyaml",
        4,
        3,
    )
    s = load_settings(config, server={"port": 9003})
    assert (s.server.port, s.server.default_scenario) == (9003, "fromyaml")


def test_non_loopback_needs_tokens() -> None:
    with pytest.raises(ConfigError, match="requires auth tokens"):
        load_settings(server={"host": "0.0.0.0"})
    token = {"name": "ops", "sha256": "a" * 64, "admin": True}
    assert (
        load_settings(server={"host": "0.0.0.0"}, auth={"tokens": [token]}).server.host == "0.0.0.0"
    )


def test_token_must_be_a_hash() -> None:
    with pytest.raises(ConfigError, match="sha256"):
        load_settings(auth={"tokens": [{"name": "ops", "sha256": "plaintext-token"}]})


def test_upstream_needs_url() -> None:
    with pytest.raises(ConfigError, match="upstream_url"):
        load_settings(engine={"kind": "upstream"})


def test_cli_reports_config_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cli.main import main

    assert main(["serve", "-c", str(_yaml(tmp_path, "reef:\n  bogus: 1\n"))]) == 2
    assert "unknown key 'reef.bogus'" in capsys.readouterr().err


def test_home_is_expanded_in_paths(tmp_path: Path) -> None:
    s = load_settings(
        _yaml(tmp_path, "server:\n  state_dir: ~/reef-state\nengine:\n  model_cache: ~/m\n")
    )
    assert s.server.state_dir == Path.home() / "reef-state"
    assert s.engine.model_cache == Path.home() / "m"


def test_prefect_ui_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the dashboard links flow runs: prefect.ui_url, else Prefect's own PREFECT_UI_URL,
    else a Prefect server's PREFECT_API_URL without /api; else nowhere."""
    for name in ("PREFECT_UI_URL", "PREFECT_API_URL"):
        monkeypatch.delenv(name, raising=False)
    assert load_settings().prefect_ui_url is None
    monkeypatch.setenv("PREFECT_API_URL", "https://prefect.internal:4200/api/")
    assert load_settings().prefect_ui_url == "https://prefect.internal:4200"
    monkeypatch.setenv("PREFECT_API_URL", "ephemeral")  # not a server: no link
    assert load_settings().prefect_ui_url is None
    monkeypatch.setenv("PREFECT_UI_URL", "http://ui.internal/")
    assert load_settings().prefect_ui_url == "http://ui.internal"
    config = _yaml(tmp_path, "prefect:\n  ui_url: http://flows.example:4200\n")
    assert load_settings(config).prefect_ui_url == "http://flows.example:4200"
    with pytest.raises(ConfigError, match=r"prefect\.ui_url"):
        load_settings(_yaml(tmp_path, "prefect:\n  ui_url: javascript:alert(1)\n"))
