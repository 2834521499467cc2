"""Settings: defaults < YAML < REEF_* env < CLI flags; unknown keys are errors naming the key."""

from __future__ import annotations

import logging
import re
import textwrap
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, SecretStr

from reef.errors import ConfigError
from reef.recipe import recipe_class
from reef.settings import (
    Settings,
    conceal,
    load_settings,
    secret_environment,
    secret_keys,
    split_secrets,
)
from reef.settings.engine import FLAT_KEYS


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
    # written before Reef's layers were one import package (reef.recipes): Reef's own module,
    # not a second copy of it under the bare name
    assert recipe_class("recipes.sao.recipe:SAORecipe") is recipe_class("sao")


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
    with pytest.raises(ConfigError, match=r"upstream\.url"):
        load_settings(engine={"kind": "upstream"})


def test_cli_reports_config_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from reef.cli.main import main

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


ROOT = Path(__file__).resolve().parents[1]
# Every key the engine had before its sections, with a value other than the default.
FLAT_ENGINE = {
    "max_batch_size": 3,
    "threads": 2,
    "prefill_chunk_tokens": 64,
    "dtype": "bfloat16",
    "prefix_cache_mb": 16,
    "packed_linear": False,
    "fuse_prefill": False,
    "itl_target_ms": 40.0,
    "itl_headroom": 0.15,
    "itl_max_wait_ms": 500.0,
    "upstream_url": "http://up.example:8000/v1",
    "upstream_model": "served",
    "upstream_api_key": "sk-upstream",
    "upstream_timeout_s": 5.0,
    "upstream_capture_tokens": True,
    "upstream_responses": True,
    "vllm_url": "http://vllm.example:8000",
    "vllm_python": "/opt/vllm/bin/python",
    "vllm_args": ["--dtype", "float32"],
    "vllm_start_timeout_s": 9.0,
    "vllm_weight_sync": "nccl",
    "vllm_max_loras": 2,
    "vllm_max_lora_rank": 8,
    "vllm_api_key": "sk-vllm",
    "vllm_host": "0.0.0.0",
    "admin_urls": ["http://reef-0:8900"],
    "registry": True,
    "advertise_url": "http://reef-1:8900",
    "heartbeat_s": 2.0,
    "registry_ttl_s": 9.0,
}


def _nested_engine(flat: dict[str, Any]) -> dict[str, Any]:
    """`flat` written with the sections (what the flat keys mean)."""
    out: dict[str, Any] = {}
    for old, value in flat.items():
        section, key = FLAT_KEYS.get(old, (None, old))
        (out.setdefault(section, {}) if section else out)[key] = value
    return out


def _deprecations(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]


def test_flat_engine_keys_load_into_their_sections(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A settings file of the flat engine keys loads as its nested form, with one deprecation
    line per key naming the old key and the new one."""
    assert set(FLAT_ENGINE) == set(FLAT_KEYS)  # every flat key is covered
    config = _yaml(tmp_path, yaml.safe_dump({"engine": FLAT_ENGINE}))
    with caplog.at_level(logging.WARNING):
        old = load_settings(config)
    assert sorted(_deprecations(caplog)) == sorted(
        f"settings in {config}: engine.{k} is deprecated, read as engine.{s}.{n}"
        for k, (s, n) in FLAT_KEYS.items()
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        new = load_settings(
            _yaml(tmp_path, yaml.safe_dump({"engine": _nested_engine(FLAT_ENGINE)}))
        )
    assert _deprecations(caplog) == []
    assert old.engine.model_dump() == new.engine.model_dump()
    assert old.engine.embedded.max_batch_size == 3 and old.engine.vllm.weight_sync == "nccl"
    assert old.engine.upstream.api_key is not None
    assert old.engine.upstream.api_key.get_secret_value() == "sk-upstream"
    assert old.engine.fleet.admin_urls == ("http://reef-0:8900",)
    # flags (overrides) take the flat keys too
    flags = load_settings(engine={"kind": "upstream", "upstream_url": "http://x:1/v1"})
    assert flags.engine.upstream.url == "http://x:1/v1"


def test_a_flat_key_beside_its_nested_place_is_refused(tmp_path: Path) -> None:
    text = "engine:\n  vllm_url: http://a:1\n  vllm:\n    url: http://b:1\n"
    with pytest.raises(ConfigError, match=r"engine\.vllm_url and engine\.vllm\.url"):
        load_settings(_yaml(tmp_path, text))


def test_engine_environment_old_and_new_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """REEF_ENGINE__... works under the flat names (values parsed as the nested keys' types)
    and the nested ones; each layer keeps its rank whichever names it uses."""
    monkeypatch.setenv("REEF_ENGINE__VLLM_ARGS", '["--max-model-len", "1024"]')
    monkeypatch.setenv("REEF_ENGINE__UPSTREAM_API_KEY", "sk-old")
    monkeypatch.setenv("REEF_ENGINE__MAX_BATCH_SIZE", "5")
    monkeypatch.setenv("REEF_ENGINE__FLEET__HEARTBEAT_S", "3")
    monkeypatch.setenv("REEF_ENGINE__VLLM__URL", "http://env:8000")
    config = _yaml(tmp_path, "engine:\n  vllm_url: http://file:8000\n  max_batch_size: 2\n")
    with caplog.at_level(logging.WARNING):
        s = load_settings(config)
    assert s.engine.vllm.args == ("--max-model-len", "1024")
    assert s.engine.upstream.api_key is not None
    assert s.engine.upstream.api_key.get_secret_value() == "sk-old"
    assert s.engine.embedded.max_batch_size == 5  # env (old name) beats the file (old name)
    assert s.engine.fleet.heartbeat_s == 3
    assert s.engine.vllm.url == "http://env:8000"  # env (new name) beats the file (old name)
    lines = _deprecations(caplog)
    for old, new in (
        ("REEF_ENGINE__VLLM_ARGS", "REEF_ENGINE__VLLM__ARGS"),
        ("REEF_ENGINE__UPSTREAM_API_KEY", "REEF_ENGINE__UPSTREAM__API_KEY"),
        ("REEF_ENGINE__MAX_BATCH_SIZE", "REEF_ENGINE__EMBEDDED__MAX_BATCH_SIZE"),
    ):
        assert lines.count(f"settings: {old} is deprecated, read as {new}") == 1, lines
    assert "sk-old" not in caplog.text
    # a flag under the flat name beats the environment's nested one
    assert load_settings(config, engine={"vllm_url": "http://flag:1"}).engine.vllm.url == (
        "http://flag:1"
    )
    monkeypatch.setenv("REEF_ENGINE__VLLM__ARGS", "[]")
    with pytest.raises(ConfigError, match="REEF_ENGINE__VLLM_ARGS and REEF_ENGINE__VLLM__ARGS"):
        load_settings()


def _doc_blocks() -> list[tuple[str, str]]:
    """(where, text) of every ```yaml block in README.md and docs/*.md, dedented."""
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for m in re.finditer(r"^( *)```yaml\n(.*?)^\1```", path.read_text(), re.M | re.S):
            line = path.read_text()[: m.start()].count("\n") + 1
            out.append((f"{path.name}:{line}", textwrap.dedent(m.group(2))))
    return out


def _settings_file(text: str) -> dict[str, Any] | None:
    """The mapping a block holds when it is a settings file (top-level keys are sections)."""
    data = yaml.safe_load(text)
    if isinstance(data, dict) and data and set(data) <= set(Settings.model_fields):
        return data
    return None


SETTINGS_BLOCKS = [(w, t) for w, t in _doc_blocks() if _settings_file(t) is not None]


def test_the_docs_hold_settings_blocks() -> None:
    assert len(SETTINGS_BLOCKS) >= 10, [w for w, _ in SETTINGS_BLOCKS]
    assert any(w.startswith("README.md") and "engine:" in t for w, t in SETTINGS_BLOCKS)


@pytest.mark.parametrize(("where", "text"), SETTINGS_BLOCKS, ids=[w for w, _ in SETTINGS_BLOCKS])
def test_every_settings_block_of_the_docs_loads(
    where: str, text: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each settings file the docs show loads as it is written, with no deprecated key, and its
    engine section written with the flat keys of earlier versions loads the same."""
    # The docs shorten token hashes (5e88…): pad them to a hash's 64 digits.
    text = re.sub(r"\b([0-9a-f]+)…", lambda m: m.group(1).ljust(64, "0"), text)
    with caplog.at_level(logging.WARNING):
        settings = load_settings(_yaml(tmp_path, text))
    assert _deprecations(caplog) == []
    data = _settings_file(text)
    assert data is not None
    engine = data.get("engine")
    if isinstance(engine, dict):
        flat = {
            k: v for k, v in engine.items() if k not in ("embedded", "upstream", "vllm", "fleet")
        }
        for section, key_of in _FLAT_OF.items():
            given = engine.get(section) or {}
            flat |= {key_of[k]: v for k, v in given.items() if k in key_of}
            # keys added after the sections (engine.fleet.registry_allow) have no flat name
            newer = {k: v for k, v in given.items() if k not in key_of}
            if newer:
                flat[section] = newer
        old = load_settings(_yaml(tmp_path, yaml.safe_dump({**data, "engine": flat})))
        assert old.model_dump() == settings.model_dump()


# section -> nested key -> flat key, FLAT_KEYS read backwards
_FLAT_OF: dict[str, dict[str, str]] = {}
for _old, (_section, _key) in FLAT_KEYS.items():
    _FLAT_OF.setdefault(_section, {})[_key] = _old


def _leaf_paths(model: type[BaseModel], path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for key, field in model.model_fields.items():
        sub = field.annotation
        entries = typing.get_args(sub)[1] if typing.get_origin(sub) is dict else None
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            out += _leaf_paths(sub, (*path, key))
        elif isinstance(entries, type) and issubclass(entries, BaseModel):  # scenarios.<name>
            out += _leaf_paths(entries, (*path, key, "<name>"))
        else:
            out.append((*path, key))
    return out


def _reference_paths() -> set[tuple[str, ...]]:
    """The (section, ..., key) of every row of docs/configuration.md's tables (generated from
    these models by `python -m reef.cli.docs`; tests/test_docs.py checks it is current)."""
    out: set[tuple[str, ...]] = set()
    section: tuple[str, ...] = ()
    for line in (ROOT / "docs" / "configuration.md").read_text().splitlines():
        heading = re.fullmatch(r"## `([\w.\[\]<>]+)`", line)
        if heading:
            section = tuple(heading.group(1).split("."))
        row = re.match(r"\| `(\w+)` \|", line)
        if row and section:
            out.add((*section, row.group(1)))
    return out


def test_the_configuration_reference_names_every_setting() -> None:
    """docs/configuration.md has a row for every key of every section, in its nested place."""
    shown = _reference_paths()
    missing = [".".join(p) for p in _leaf_paths(Settings) if p not in shown]
    assert missing == []


def test_secret_settings_travel_apart_at_any_depth() -> None:
    overrides = {
        "engine": {"kind": "upstream", "upstream": {"url": "http://u:1/v1", "api_key": "sk-a"}},
        "store": {"database_url": "postgresql+psycopg://u:pw@h/db"},
    }
    public, secret = split_secrets(overrides)
    assert public == {"engine": {"kind": "upstream", "upstream": {"url": "http://u:1/v1"}}}
    assert secret_environment(secret) == {
        "REEF_ENGINE__UPSTREAM__API_KEY": "sk-a",
        "REEF_STORE__DATABASE_URL": "postgresql+psycopg://u:pw@h/db",
    }
    # a flat key is the same secret
    assert split_secrets({"engine": {"vllm_api_key": "sk-b"}}) == (
        {},
        {"engine": {"vllm": {"api_key": "sk-b"}}},
    )
    hidden = conceal(overrides)
    assert hidden["engine"]["upstream"]["url"] == "http://u:1/v1"
    assert isinstance(hidden["engine"]["upstream"]["api_key"], SecretStr)
    assert "sk-a" not in str(hidden)
    assert ("engine", "vllm", "api_key") in secret_keys()


def test_each_scenario_learns_with_its_own_settings(tmp_path: Path) -> None:
    """scenarios.<name>: reef, gate and judge keys merged over the top-level ones (mappings key
    by key, the rest replaced), validated at load with the scenario and key named; keys of the
    process stay top-level; what the operator did not set stays unset (a recipe's own gate)."""
    config = tmp_path / "c.yaml"
    config.write_text(
        textwrap.dedent(
            """
            reef: {recipe: sft, batch_size: 8, params: {epochs: 2, lr: 0.001}}
            gate: {margin: 0.1}
            scenarios:
              coder:
                reef: {recipe: openclaw, batch_size: 4, params: {lr: 0.0003}}
                judge: {votes: 5}
              support: {gate: {policy: always}, reef: {select: {tags: {role: agent}}}}
              tuner: {reef: {recipe: tttd}}
            """
        )
    )
    s = load_settings(config)
    coder = s.for_scenario("coder")
    assert (coder.reef.recipe, coder.reef.batch_size) == ("openclaw", 4)
    assert coder.reef.params == {"epochs": 2, "lr": 0.0003} and coder.judge.votes == 5
    assert coder.gate.margin == 0.1 and s.judge.votes != 5
    support = s.for_scenario("support")
    assert support.gate.policy == "always" and support.gate.margin == 0.1
    assert support.reef.recipe == "sft" and support.reef.select.tags == {"role": "agent"}
    assert "policy" not in s.for_scenario("tuner").gate.model_fields_set  # tttd's own gate
    assert s.for_scenario("anything-else") is s
    # The engine's sampling values, the one engine key a scenario has: replaced as a whole.
    sampled = load_settings(
        None,
        engine={"sampling_defaults": {"temperature": 0.2, "top_p": 0.9}},
        scenarios={"a": {"engine": {"sampling_defaults": {"top_p": 0.5}}}},
    )
    assert sampled.for_scenario("a").engine.sampling_defaults == {"top_p": 0.5}
    off = sampled.for_scenario("a", {"engine": {"sampling_defaults": {}}})
    assert off.engine.sampling_defaults == {}
    assert off.engine.model == sampled.engine.model
    assert sampled.for_scenario("b").engine.sampling_defaults == {"temperature": 0.2, "top_p": 0.9}

    for text, said in (
        ("scenarios: {x: {reef: {batch_size: 0}}}", "scenarios.x.reef: batch_size"),
        ("scenarios: {x: {gate: {nope: 1}}}", "scenarios.x.gate: unknown key 'nope'"),
        ("scenarios: {x: {reef: {recipe: nonsense}}}", "scenarios.x.reef: recipe: recipe must be"),
        ("scenarios: {x: {reef: {worker_priority: low}}}", "worker_priority: process-wide"),
        ("scenarios: {x: {engine: {model: smollm2}}}", "unknown key 'scenarios.x.engine.model'"),
        (
            "scenarios: {x: {engine: {sampling_defaults: {top_k: 5}}}}",
            "scenarios.x.engine.sampling_defaults: sampling_defaults takes temperature and top_p",
        ),
    ):
        config.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(said)):
            load_settings(config)


def test_reef_metric_names_score_or_a_declared_number() -> None:
    metrics = {"helpful": {"type": "boolean"}, "tone": {"type": "categorical", "values": ["a"]}}
    s = load_settings(None, metrics=metrics, reef={"metric": "helpful"})
    assert s.reef.metric == "helpful"
    assert load_settings(None).reef.metric == "score"
    with pytest.raises(ConfigError, match=r"reef\.metric 'accuracy' is not a declared metric"):
        load_settings(None, metrics=metrics, reef={"metric": "accuracy"})
    with pytest.raises(ConfigError, match=r"reef\.metric 'tone' is categorical"):
        load_settings(None, metrics=metrics, reef={"metric": "tone"})
    # a scenario's own metric, declared for it alone
    own = {"support": {"reef": {"metric": "kind"}, "metrics": {"kind": {"type": "float"}}}}
    assert load_settings(None, scenarios=own).for_scenario("support").reef.metric == "kind"
    with pytest.raises(ConfigError, match=r"scenarios\.other: reef\.metric 'kind'"):
        load_settings(None, scenarios={"other": {"reef": {"metric": "kind"}}})
    with pytest.raises(ConfigError, match=r"metrics.x: range is \[low, high\]"):
        load_settings(None, metrics={"x": {"type": "float", "range": [2, 1]}})
    with pytest.raises(ConfigError, match="'score' is the default metric"):
        load_settings(None, metrics={"score": {"type": "float"}})
    with pytest.raises(ConfigError, match="a categorical metric lists its values"):
        load_settings(None, metrics={"x": {"type": "categorical"}})
