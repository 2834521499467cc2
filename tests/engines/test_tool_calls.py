"""Tool calls on the embedded engine: which templates take tools, `<tool_call>` text parsed into
OpenAI tool calls (whole answers and streams, pure functions), and a 400 from an engine whose
template cannot show tools. The taught tiny model's tool loop is tests/api/test_tool_loop.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from reef.engines import tool_calls
from reef.engines.base import Completion
from reef.engines.tool_calls import CallStream, ToolsUnsupported, split_calls, with_calls
from reef.models import CHAT_TEMPLATE
from tests.engines.conftest import running_engine
from tests.toolmodel import (
    ASK,
    NO_TOOLS_TEMPLATE,
    TOOLS,
    without_tools,
)

CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_templates_that_read_tools_take_them() -> None:
    assert tool_calls.template_takes_tools(CHAT_TEMPLATE)  # the tiny model's (Hermes style)
    assert not tool_calls.template_takes_tools(NO_TOOLS_TEMPLATE)  # like SmolLM2's GGUF
    # a template transformers' own extensions make unparsable still counts by its text
    assert tool_calls.template_takes_tools("{% generation %}{{ tools }}{% endgeneration %}")


def test_split_calls_reads_calls_and_keeps_everything_else_as_text() -> None:
    content, calls = split_calls(CALL_TEXT)
    assert content is None and len(calls) == 1
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    # text before, two calls (one cut off before its closing tag), string arguments
    text = f'Let me look.\n{CALL_TEXT}\n<tool_call>{{"name": "f", "arguments": "x"}}'
    content, calls = split_calls(text)
    assert content == "Let me look." and [c["function"]["name"] for c in calls] == [
        "get_weather",
        "f",
    ]
    assert calls[1]["function"]["arguments"] == "x"
    # not a clean call answer: all of it stays text
    for text in ("no calls here", "<tool_call>{not json}</tool_call>", f"{CALL_TEXT} and more"):
        assert split_calls(text) == (text, [])
    assert split_calls('<tool_call>{"arguments": {}}</tool_call>')[1] == []  # no name


def test_with_calls_rewrites_the_message_and_finish_reason() -> None:
    response = {"choices": [{"index": 0, "message": {"role": "assistant", "content": CALL_TEXT}}]}
    out = with_calls(response)
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    plain = {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]}
    assert with_calls(plain) == plain


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, **extra}
    return {"id": "c", "object": "chat.completion.chunk", "choices": [choice]}


def _run_stream(pieces: list[str]) -> list[dict[str, Any]]:
    stream = CallStream()
    out: list[dict[str, Any]] = []
    for piece in pieces:
        out += stream.chunk(_chunk({"content": piece}, token_ids=[1]))
    return out + stream.chunk(_chunk({}, "stop"))


def test_a_stream_sends_text_then_the_calls_as_deltas() -> None:
    pieces = [
        "Sure",
        ". <tool",
        '_call>\n{"name": "get_weather",',
        ' "arguments": {"city": "Paris"}}\n',
        "</tool_call>",
    ]
    out = _run_stream(pieces)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in out)
    assert text == "Sure. "  # the tag's possible start was held back, then everything after it
    assert all(c["choices"][0].get("token_ids") == [1] for c in out[: len(pieces)])  # kept
    (calls,) = [
        c["choices"][0]["delta"]["tool_calls"]
        for c in out
        if "tool_calls" in c["choices"][0]["delta"]
    ]
    assert calls[0]["index"] == 0 and calls[0]["function"]["name"] == "get_weather"
    assert out[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_stream_without_a_clean_call_sends_all_its_text() -> None:
    for pieces in (["a <", "tool", " b"], ["x <tool_call>{broken", "</tool_call>"]):
        out = _run_stream(pieces)
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in out) == "".join(
            pieces
        )
        assert out[-1]["choices"][0]["finish_reason"] == "stop"


def test_the_stream_completion_carries_the_streamed_call_ids() -> None:
    stream = CallStream()
    chunks = stream.chunk(_chunk({"content": CALL_TEXT})) + stream.chunk(_chunk({}, "stop"))
    sent = next(c for c in chunks if "tool_calls" in c["choices"][0]["delta"])
    done = Completion(response={"choices": [{"message": {"content": CALL_TEXT}}]})
    final = stream.completion(done).response["choices"][0]["message"]["tool_calls"]
    assert final[0]["id"] == sent["choices"][0]["delta"]["tool_calls"][0]["id"]


def test_a_template_without_tools_refuses_them(tiny_dir: Path, tmp_path: Path) -> None:
    plain = without_tools(tiny_dir, tmp_path / "no-tools")
    body = {"model": "tiny", "messages": [{"role": "user", "content": ASK}], "max_tokens": 2}

    async def go() -> Completion:
        with pytest.raises(ToolsUnsupported) as err:
            await engine.complete({**body, "tools": TOOLS})
        assert err.value.status == 400 and err.value.code == "tools_unsupported"
        assert err.value.param == "tools"
        # tool_choice "none": nothing to show the model, nothing to refuse
        return await engine.complete({**body, "tools": TOOLS, "tool_choice": "none"})

    with running_engine(plain) as engine:
        done = asyncio.run(go())
    assert done.response["choices"][0]["message"]["content"] is not None


def test_a_converted_smollm2_gets_the_tool_aware_template_in_place(tmp_path: Path) -> None:
    """A SmolLM2 directory converted before tools existed keeps its weights; only its template
    file is replaced, and a template someone changed by hand is left alone."""
    from reef import models

    model_dir = tmp_path / "smollm2-hf"
    model_dir.mkdir()
    (model_dir / "chat_template.jinja").write_text(models.SMOLLM2_GGUF_TEMPLATE)
    models._upgrade_template(model_dir, models.SMOLLM2_GGUF_TEMPLATE, models.SMOLLM2_TEMPLATE)
    assert (model_dir / "chat_template.jinja").read_text() == models.SMOLLM2_TEMPLATE
    assert tool_calls.template_takes_tools(models.SMOLLM2_TEMPLATE)
    assert not tool_calls.template_takes_tools(models.SMOLLM2_GGUF_TEMPLATE)
    (model_dir / "chat_template.jinja").write_text("{{ messages }}")
    models._upgrade_template(model_dir, models.SMOLLM2_GGUF_TEMPLATE, models.SMOLLM2_TEMPLATE)
    assert (model_dir / "chat_template.jinja").read_text() == "{{ messages }}"


@pytest.mark.slow
def test_smollm2_serves_tools_and_renders_its_own_prompts_unchanged() -> None:
    """SmolLM2-135M-Instruct's own template (from its GGUF) has no place for tools; the one Reef
    serves it with renders tools, and renders every tool-free conversation exactly as the GGUF's
    template does, so the model sees the prompts it was tuned on."""
    from transformers import AutoTokenizer

    from reef.engines.prompt import ChatRenderer
    from reef.models import SMOLLM2_GGUF, SMOLLM2_GGUF_TEMPLATE, resolve_model

    cache = Path.home() / ".cache" / "reef" / "models"
    gguf = cache / SMOLLM2_GGUF
    original = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    assert original.chat_template == SMOLLM2_GGUF_TEMPLATE
    served = AutoTokenizer.from_pretrained(resolve_model("smollm2", cache))
    assert ChatRenderer(served).takes_tools
    conversations = [
        [{"role": "user", "content": ASK}],
        [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": ASK},
        ],
    ]
    for messages in conversations:
        for generation in (True, False):
            assert served.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=generation
            ) == original.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=generation
            )
    body = {"model": "smollm2", "messages": [{"role": "user", "content": ASK}], "tools": TOOLS}
    assert '"get_weather"' in ChatRenderer(served).prompt_text(body)
