"""A model's recommended sampling values (generation_config.json) for requests that name none.

SmolLM2 at OpenAI's default temperature 1.0 answers mostly gibberish; the conversion writes the
values it answers well with (reef.models.SMOLLM2_SAMPLING) into its generation_config.json.
These tests run on a copy of the tiny model given the same recommendation, except the last
(slow) one, which asks the README's own question of SmolLM2 through the server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from reef.cli.testing import InProcessReef
from reef.engines.base import Completion
from reef.engines.defaults import generation_defaults, sampling_tags
from reef.models import SMOLLM2_SAMPLING, _add_sampling_defaults
from reef.settings import EngineSettings
from tests.engines.conftest import running_engine

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def recommending_dir(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model whose generation_config.json recommends SmolLM2's values."""
    out = tmp_path_factory.mktemp("tiny-recommends")
    for f in tiny_dir.iterdir():
        (out / f.name).symlink_to(f)
    (out / "generation_config.json").unlink()
    (out / "generation_config.json").write_text((tiny_dir / "generation_config.json").read_text())
    _add_sampling_defaults(out, SMOLLM2_SAMPLING)
    return out


@pytest.fixture(scope="module")
def engine(recommending_dir: Path) -> Iterator[Any]:
    with running_engine(recommending_dir, default_max_tokens=12) as e:
        yield e


def ask(engine: Any, **params: Any) -> Completion:
    done: Completion = asyncio.run(engine.complete({"messages": QUESTION, "seed": 7, **params}))
    return done


def test_conversion_writes_the_recommendation_once(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    _add_sampling_defaults(tmp_path, SMOLLM2_SAMPLING)  # an earlier Reef's conversion: upgraded
    assert generation_defaults(tmp_path) == {"temperature": 0.2, "top_p": 0.5}
    config = json.loads((tmp_path / "generation_config.json").read_text())
    assert config["eos_token_id"] == 2 and config["do_sample"] is True
    # A config that names its own sampling values keeps them.
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.7}))
    _add_sampling_defaults(tmp_path, SMOLLM2_SAMPLING)
    assert generation_defaults(tmp_path) == {"temperature": 0.7}


def test_defaults_apply_when_a_request_names_none(engine: Any) -> None:
    defaulted = ask(engine)
    assert defaulted.sampling == {
        "temperature": 0.2,
        "top_p": 0.5,
        "defaults": ["temperature", "top_p"],
    }
    # The same draw as a request naming those values itself (same seed).
    explicit = ask(engine, temperature=0.2, top_p=0.5)
    assert explicit.sampling == {"temperature": 0.2, "top_p": 0.5, "defaults": []}
    assert defaulted.completion_token_ids == explicit.completion_token_ids


def test_explicit_values_win(engine: Any) -> None:
    greedy = ask(engine, temperature=0)
    # Naming any sampling parameter takes the request as it is: no top_p cut for it.
    assert greedy.sampling == {"temperature": 0.0, "top_p": 1.0, "defaults": []}
    again = ask(engine, temperature=0, seed=8)
    assert greedy.completion_token_ids == again.completion_token_ids  # greedy: seed ignored
    hot = ask(engine, temperature=2.0, top_p=1.0)
    assert hot.sampling == {"temperature": 2.0, "top_p": 1.0, "defaults": []}
    assert ask(engine, top_p=0.8).sampling == {"temperature": 1.0, "top_p": 0.8, "defaults": []}
    # A null counts as left out, as in vLLM.
    assert ask(engine, temperature=None).sampling == ask(engine).sampling


def test_a_setting_overrides_or_disables_the_model_defaults(recommending_dir: Path) -> None:
    with running_engine(recommending_dir, default_max_tokens=4, sampling_defaults={}) as e:
        assert ask(e).sampling == {"temperature": 1.0, "top_p": 1.0, "defaults": []}
    with running_engine(
        recommending_dir, default_max_tokens=4, sampling_defaults={"temperature": 0.5}
    ) as e:
        assert ask(e).sampling == {"temperature": 0.5, "top_p": 1.0, "defaults": ["temperature"]}
    with pytest.raises(ValueError, match="top_p"):
        EngineSettings(sampling_defaults={"top_p": 0})
    with pytest.raises(ValueError, match="top_k"):
        EngineSettings(sampling_defaults={"top_k": 40})


def _tags(server: InProcessReef, scenario: str, stream: bool = False, **params: Any) -> Any:
    """The sampling tags of the record of one call to `scenario` through the openai SDK."""
    client = openai.OpenAI(
        base_url=server.base_url, api_key="unused", default_headers={"x-reef-scenario": scenario}
    )
    raw = client.chat.completions.with_raw_response.create(
        model=Path(server.settings.engine.model).name,
        messages=QUESTION,
        max_tokens=4,
        stream=stream,
        **params,
    )
    if stream:
        list(raw.parse())  # the record is durable once the stream has ended
    receipt = raw.headers["x-reef-agent-record-id"]
    record = httpx.get(f"{server.url}/reef/scenarios/{scenario}/records/{receipt}").json()
    return {
        k: v
        for k, v in record["tags"].items()
        if k in ("reef.temperature", "reef.top_p", "reef.sampling_defaults")
    }


MODEL_DEFAULTS = {
    "reef.temperature": "0.2",
    "reef.top_p": "0.5",
    "reef.sampling_defaults": "temperature,top_p",
}


def test_the_record_names_the_values_each_scenario_its_own(
    recommending_dir: Path, tmp_path: Path
) -> None:
    """The model's values, a scenario's own from the configuration ({} turning them off), and
    a scenario's changed at run time; each record names what its answer was sampled with."""
    scenarios = {
        "greedy": {"engine": {"sampling_defaults": {"temperature": 0.0}}},
        "plain": {"engine": {"sampling_defaults": {}}},
    }
    with InProcessReef(
        tmp_path, engine={"model": str(recommending_dir)}, scenarios=scenarios
    ) as server:
        assert _tags(server, "s") == sampling_tags(
            {"temperature": 0.2, "top_p": 0.5, "defaults": ["temperature", "top_p"]}
        )
        assert _tags(server, "s") == MODEL_DEFAULTS
        assert _tags(server, "s", temperature=0.0) == {
            "reef.temperature": "0.0",
            "reef.top_p": "1.0",
        }
        greedy = {
            "reef.temperature": "0.0",
            "reef.top_p": "1.0",
            "reef.sampling_defaults": "temperature",
        }
        assert _tags(server, "greedy") == greedy
        assert _tags(server, "greedy", stream=True) == greedy
        assert _tags(server, "greedy", top_p=0.9) == {
            "reef.temperature": "1.0",
            "reef.top_p": "0.9",
        }
        assert _tags(server, "plain") == {"reef.temperature": "1.0", "reef.top_p": "1.0"}
        # At run time, without a restart: this replica applies it from the next call.
        url = f"{server.url}/reef/scenarios/s/settings"
        bad = httpx.put(url, json={"engine": {"sampling_defaults": {"top_k": 5}}})
        assert bad.status_code == 400 and "top_k" in bad.json()["error"]["message"]
        put = httpx.put(url, json={"engine": {"sampling_defaults": {"temperature": 0.7}}})
        assert put.status_code == 200, put.text
        assert put.json()["effective"]["engine"] == {"sampling_defaults": {"temperature": 0.7}}
        assert _tags(server, "s") == {
            "reef.temperature": "0.7",
            "reef.top_p": "1.0",
            "reef.sampling_defaults": "temperature",
        }
        # A run-time {} replaces the configuration's values as a whole (never merged into them).
        url = f"{server.url}/reef/scenarios/greedy/settings"
        assert httpx.put(url, json={"engine": {"sampling_defaults": {}}}).status_code == 200
        assert _tags(server, "greedy") == {"reef.temperature": "1.0", "reef.top_p": "1.0"}
        # Dropping the run-time keys brings back the configuration's.
        assert httpx.put(url, json={}).status_code == 200
        assert _tags(server, "greedy") == greedy


@pytest.mark.slow
def test_the_readme_example_answers_sensibly_on_smollm2(tmp_path: Path) -> None:
    """README Quick start's request, unchanged (no temperature), ten times: Paris in 9 or more."""
    cache = EngineSettings().model_cache
    if not (cache / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file():
        pytest.skip("SmolLM2 GGUF missing: run `make smollm2`")
    with InProcessReef(tmp_path, engine={"model": "smollm2"}) as server:
        client = openai.OpenAI(
            base_url=server.base_url,
            api_key="unused",
            default_headers={"x-reef-scenario": "support-bot"},
        )
        answers = []
        for _ in range(10):
            raw = client.chat.completions.with_raw_response.create(
                model="smollm2", messages=QUESTION
            )
            answers.append(raw.parse().choices[0].message.content or "")
    sensible = [a for a in answers if "Paris" in a]
    assert len(sensible) >= 9, answers
