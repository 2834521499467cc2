"""A tiny model that calls a tool: the deterministic tiny model, taught by a few Adam steps to
answer "What is the weather in Paris?" with a `get_weather` call and the tool's answer with a
sentence. The random tiny model never writes `<tool_call>` by itself; this one does, greedily,
so a tool loop through the real embedded engine (template in, calls parsed out) is testable
end to end. A copy with a template that has no tools stands in for SmolLM2-like models."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

ASK = "What is the weather in Paris?"
CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}
RESULT = "sunny, 21 C"
ANSWER = "It is sunny in Paris."
FUNCTION = {
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
TOOLS = [{"type": "function", "function": FUNCTION}]

# SmolLM2's own template (ChatML without tools), as its GGUF carries it.
NO_TOOLS_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def conversation() -> list[tuple[list[dict[str, Any]], str]]:
    """The two turns of the loop: (messages so far, the answer the model learns)."""
    ask = [{"role": "user", "content": ASK}]
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "call_1", "type": "function", "function": CALL}],
    }
    answered = [*ask, call, {"role": "tool", "tool_call_id": "call_1", "content": RESULT}]
    return [
        (ask, f"<tool_call>\n{json.dumps(CALL)}\n</tool_call>"),
        (answered, ANSWER),
    ]


def teach_tool_calls(tiny_dir: Path, out: Path, max_steps: int = 100) -> Path:
    """A copy of the tiny model in `out` that answers the two turns greedily (~10 steps)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    data = []
    for messages, answer in conversation():
        prompt = tokenizer.apply_chat_template(
            messages, tools=TOOLS, tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        data.append((ids, [*tokenizer.encode(answer, add_special_tokens=False), end]))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        model.train()
        for _ in range(max_steps):
            total = 0.0
            for prompt_ids, answer_ids in data:
                ids = torch.tensor([prompt_ids + answer_ids])
                labels = ids.clone()
                labels[0, : len(prompt_ids)] = -100
                loss = model(input_ids=ids, labels=labels).loss
                loss.backward()
                total += float(loss.detach())
            opt.step()
            opt.zero_grad()
            if total < 0.02:
                break
    model.eval().save_pretrained(out)
    for file in tiny_dir.iterdir():  # the tokenizer and its chat template
        if file.name.startswith(("tokenizer", "chat_template", "special_tokens")):
            shutil.copy(file, out / file.name)
    return out


def taught_model(cache_dir: Path) -> Path:
    """The taught model in `cache_dir` (taught once, then reused: ~10 s of CPU it need not
    spend again), next to the tiny model it starts from."""
    from reef.models import TINY_DIR, resolve_model

    target = cache_dir / f"{TINY_DIR}-tools-v1"
    if (target / "config.json").is_file():
        return target
    tiny = resolve_model("tiny", cache_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=cache_dir))
    try:
        teach_tool_calls(tiny, tmp)
        tmp.chmod(0o755)
        try:
            os.rename(tmp, target)
        except OSError:  # another process taught it first
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def without_tools(model_dir: Path, out: Path) -> Path:
    """A copy of `model_dir` whose chat template cannot render tools."""
    shutil.copytree(model_dir, out)
    (out / "chat_template.jinja").unlink(missing_ok=True)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = NO_TOOLS_TEMPLATE
    config_path.write_text(json.dumps(config))
    return out
