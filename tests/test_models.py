"""Model resolution: the tiny model is deterministic and standard; specs fail clearly."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoTokenizer

from reef.errors import ConfigError
from reef.models import _cached, resolve_model


def _digest(path: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(path.iterdir())}


def test_tiny_is_the_same_everywhere(tmp_path: Path) -> None:
    a = resolve_model("tiny", tmp_path / "a")
    b = resolve_model("tiny", tmp_path / "b")
    assert a == tmp_path / "a" / "tiny-v1"
    assert _digest(a) == _digest(b)
    assert resolve_model("tiny", tmp_path / "a") == a  # built once, then reused
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["tiny-v1"]  # no temp dir left


def test_tiny_is_a_standard_model_dir(tmp_path: Path) -> None:
    path = resolve_model("tiny", tmp_path)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in path.iterdir()
    }
    config = AutoConfig.from_pretrained(path)
    assert config.model_type == "llama"
    assert config.hidden_size // config.num_attention_heads == config.head_dim == 64
    assert config.max_position_embeddings == 2048
    tokenizer_config = json.loads((path / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"

    tok = AutoTokenizer.from_pretrained(path)
    assert 256 < len(tok) <= config.vocab_size
    assert tok.eos_token == "<|im_end|>" and config.eos_token_id == tok.eos_token_id
    assert tok.pad_token == "<|endoftext|>"
    assert "<|im_start|>" in tok.all_special_tokens
    assert tok.decode(tok.encode("Café 🙂", add_special_tokens=False)) == "Café 🙂"

    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "sunny"},
    ]
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]
    text = tok.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    assert text.startswith("<|im_start|>system\nBe brief.\n\n")
    assert '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<|im_start|>tool\n<tool_response>\nsunny\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")
    plain = tok.apply_chat_template(messages[1:2], tokenize=False, add_generation_prompt=False)
    assert plain.startswith("<|im_start|>system\n") and plain.endswith("Weather?<|im_end|>\n")


def test_a_local_dir_is_used_as_is(tmp_path: Path) -> None:
    tiny = resolve_model("tiny", tmp_path)
    assert resolve_model(str(tiny), tmp_path / "other") == tiny


def test_unknown_specs_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no-such-model"):
        resolve_model("no-such-model", tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"config\.json"):
        resolve_model(str(tmp_path / "empty"), tmp_path)


def test_smollm2_without_its_gguf_says_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="make smollm2"):
        resolve_model("smollm2", tmp_path)


def test_concurrent_builds_leave_one_complete_dir(tmp_path: Path) -> None:
    target = tmp_path / "model"
    barrier = threading.Barrier(4)
    results: list[Path] = []

    def build(out: Path) -> None:
        barrier.wait()  # everyone builds at once
        (out / "weights").write_text(threading.current_thread().name)
        (out / "config.json").write_text("{}")

    def worker() -> None:
        results.append(_cached(target, build))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [target] * 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "weights"]


def test_a_failed_build_leaves_nothing(tmp_path: Path) -> None:
    def build(out: Path) -> None:
        (out / "half").write_text("x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        _cached(tmp_path / "model", build)
    assert list(tmp_path.iterdir()) == []
