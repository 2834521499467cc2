"""Model resolution: a spec ("tiny", "smollm2" or a local directory) to a local Hugging Face model dir.

Every model the embedded engine (and a vLLM server) loads is a plain Hugging Face directory:
config.json, model.safetensors, tokenizer.json + tokenizer_config.json with a chat template.
"tiny" is a deterministic random Llama generated here in seconds, for fast tests; "smollm2" is
SmolLM2-135M-Instruct converted once from the GGUF that `make smollm2` fetches. Both are built in
a temporary directory and renamed into place, so concurrent processes never see half a model.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reef.errors import ConfigError

log = logging.getLogger(__name__)

TINY_DIR = "tiny-v1"  # bump the suffix whenever the recipe below changes
SMOLLM2_GGUF = "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIR = "smollm2-hf"

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# What a request to SmolLM2 that names no sampling parameter gets (the GGUF carries no generation
# config). At OpenAI's default temperature 1.0 most of its answers are gibberish. The model card
# samples at temperature 0.2, top_p 0.9, but this Q4_1 conversion's first token of an answer is
# nearly a tie ("The" 15 %, "L" 14 % for "What is the capital of France?", and "L" runs on into
# French word salad): 0.2 / 0.9 answered Paris 14 times in 24, 0.2 / 0.5 24 in 24.
SMOLLM2_SAMPLING = {"temperature": 0.2, "top_p": 0.5}


def chatml_template(default_system: str) -> str:
    """ChatML as SmolLM2 writes it, plus tools in the Hermes/Qwen style (a system block listing
    the tools, <tool_call> JSON for an assistant's calls, <tool_response> for the tool role), so
    an agent's whole conversation renders into one prompt the model could learn from. Without
    tools it renders exactly what SmolLM2's own template renders, with `default_system` as the
    system turn of a conversation that has none."""
    return (
        "{%- if tools %}"
        "{{- '<|im_start|>system\\n' }}"
        "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
        "{{- 'You may call one or more functions. Function signatures:\\n<tools>' }}"
        "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
        "{{- '\\n</tools>\\nTo call one, reply with <tool_call>"
        '{\\"name\\": <name>, \\"arguments\\": <args>}'
        "</tool_call>.<|im_end|>\\n' }}"
        "{%- elif messages[0]['role'] != 'system' %}"
        "{{- '<|im_start|>system\\n' + " + json.dumps(default_system) + " + '<|im_end|>\\n' }}"
        "{%- endif %}"
        "{%- for message in messages %}"
        "{%- if message['role'] == 'system' and (loop.first and tools) %}"
        "{%- elif message['role'] == 'assistant' and message.get('tool_calls') %}"
        "{{- '<|im_start|>assistant' }}"
        "{%- if message['content'] %}{{- '\\n' + message['content'] }}{%- endif %}"
        "{%- for call in message['tool_calls'] %}"
        "{%- set fn = call['function'] if call['function'] is defined else call %}"
        "{{- '\\n<tool_call>\\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' }}"
        "{%- if fn['arguments'] is string %}{{- fn['arguments'] }}"
        "{%- else %}{{- fn['arguments'] | tojson }}{%- endif %}"
        "{{- '}\\n</tool_call>' }}"
        "{%- endfor %}"
        "{{- '<|im_end|>\\n' }}"
        "{%- elif message['role'] == 'tool' %}"
        "{{- '<|im_start|>tool\\n<tool_response>\\n' + message['content'] + '\\n</tool_response><|im_end|>\\n' }}"
        "{%- else %}"
        "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
        "{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )


# The tiny model's template.
CHAT_TEMPLATE = chatml_template("You are a helpful AI assistant named Reef.")

# SmolLM2-135M-Instruct's template as its GGUF carries it: ChatML without any place for tools.
SMOLLM2_GGUF_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# What Reef serves SmolLM2 with: the same prompts, and tools rendered the way the tiny model's
# template renders them, so agents that send tools on every call (pi, Codex, Claude Code,
# opencode) are served instead of refused.
SMOLLM2_TEMPLATE = chatml_template(
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
)

# The tiny tokenizer learns its merges from this fixed text: chat phrasing, digits, code and JSON,
# so tokens span several bytes (as in a real tokenizer) and multi-byte UTF-8 shows up too.
_CORPUS = """\
The quick brown fox jumps over the lazy dog. What is the capital of France? Paris is the capital
of France. Berlin is the capital of Germany. Rome is the capital of Italy. You are a helpful
assistant. Answer in at most five words. Please answer the question briefly and politely.
Hello! How can I help you today? Thank you very much. I do not know the answer to that question.
The weather today is sunny with a light breeze; tomorrow it will rain in the afternoon.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 42 100 256 1024 2048 3.14 2.718 -1 +1 = 7 * 6.
def add(a, b):
    return a + b

for i in range(10):
    print(i, i * i)

{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
{"type": "function", "function": {"name": "search", "parameters": {"query": "string"}}}
<tool_call> </tool_call> <tool_response> </tool_response> <tools> </tools>
system user assistant tool function arguments content role message messages
Café, naïve, jalapeño, Zürich, Ångström, façade, résumé. 東京は日本の首都です。 Привет, мир!
Emoji: 🙂 🚀 ✨ — “quoted” ‘text’ … € £ ¥ ° ± × ÷
A record is one stored exchange; a report quotes receipts; a recipe turns experience into releases.
Learning from feedback: the agent improves when its answers are scored, corrected and replayed.
"""


def model_id(spec: str) -> str:
    """The model name clients use for `spec`: smollm2, tiny, or the model directory's name."""
    return spec if spec in ("smollm2", "tiny") else Path(spec).expanduser().name


def resolve_model(spec: str, cache_dir: Path) -> Path:
    """Return a local Hugging Face model directory for `spec`, building it on first use."""
    cache_dir = Path(cache_dir).expanduser()
    if spec == "tiny":
        return _cached(cache_dir / TINY_DIR, _build_tiny)
    if spec == "smollm2":
        gguf = cache_dir / SMOLLM2_GGUF
        if not gguf.is_file():
            raise ConfigError(
                f"SmolLM2 GGUF not found at {gguf}: run `make smollm2` "
                f"(with MODEL_CACHE={cache_dir} if that is not the default cache)"
            )
        out = _cached(cache_dir / SMOLLM2_DIR, lambda out: _convert_gguf(gguf, out))
        _upgrade_template(out, SMOLLM2_GGUF_TEMPLATE, SMOLLM2_TEMPLATE)
        _add_sampling_defaults(out, SMOLLM2_SAMPLING)
        return out
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    raise ConfigError(
        f"unknown model '{spec}': expected 'smollm2', 'tiny' or a local Hugging Face model "
        "directory containing config.json"
    )


def _upgrade_template(model_dir: Path, old: str, new: str) -> None:
    """Give a model converted by an earlier Reef its current chat template, in place: only the
    template file changes (weights, and so every release built on them, stay valid). Atomic, so
    two processes may do it at once."""
    path = model_dir / "chat_template.jinja"
    if not path.is_file() or path.read_text() != old:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(new)
    tmp.chmod(0o644)
    os.replace(tmp, path)
    log.info("%s: chat template upgraded (tools rendered)", model_dir)


def _add_sampling_defaults(model_dir: Path, sampling: dict[str, float]) -> None:
    """Write recommended sampling values into `model_dir`'s generation_config.json, where the
    engines (and vLLM) read a model's defaults from (reef.engines.defaults): at conversion, and
    in place for a model converted by an earlier Reef. A config that names any sampling value
    already is left alone. Atomic, so two processes may do it at once."""
    path = model_dir / "generation_config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        config = {}
    if any(key in config for key in ("temperature", "top_p", "top_k", "do_sample")):
        return
    config.update(sampling, do_sample=True)  # transformers ignores temperature without it
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(config, indent=2) + "\n")
    tmp.chmod(0o644)
    os.replace(tmp, path)
    log.info("%s: sampling defaults %s written to generation_config.json", model_dir, sampling)


def _cached(target: Path, build: Callable[[Path], None]) -> Path:
    """Build into a private temp dir next to `target`, then rename it into place atomically.

    Two processes may build at once; the loser's rename fails on the existing directory and it
    drops its copy. The rename is what makes `config.json` existing mean the model is complete.
    """
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(tmp)
        # mkdtemp (and safetensors) create owner-only modes; the cache is shared by state dirs.
        tmp.chmod(0o755)
        for f in tmp.iterdir():
            f.chmod(0o644)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
            log.info("model %s was built concurrently by another process", target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _build_tiny(out: Path) -> None:
    """A 2-layer random Llama (head_dim 64, as vLLM's CPU attention needs) with a local BPE."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        # Wider than the usual 0.02, so logits are spread out: greedy answers then sit far from
        # ties and stay the same whether a sequence is decoded alone or in a padded batch.
        initializer_range=0.2,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        tie_word_embeddings=False,
    )
    # Fixed seed for identical weights everywhere; fork_rng keeps the caller's RNG untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)
        model = LlamaForCausalLM(config).eval()  # float32, torch's default dtype
    model.save_pretrained(out)
    _save_tokenizer(tokenizer, out, max_length=config.max_position_embeddings)


def _tiny_tokenizer() -> Any:  # a PreTrainedTokenizerFast
    """Byte-level BPE trained on the fixed corpus: the same merges on every machine."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS.splitlines(keepends=True), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )


def _save_tokenizer(tokenizer: Any, out: Path, *, max_length: int) -> None:
    """Save, then name the class every transformers version (and vLLM) knows."""
    tokenizer.save_pretrained(out)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    # Loading details of this one load, not properties of the tokenizer.
    for key in ("is_local", "local_files_only", "name_or_path"):
        config.pop(key, None)
    config["model_max_length"] = max_length
    # transformers 5 writes its internal "TokenizersBackend"; older releases (the one vLLM pins)
    # only know the public alias, which both load as the same fast tokenizer.
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    # Older releases read a list of extra special tokens only under its former name (they take
    # `extra_special_tokens` to be a dict and fail on a list).
    extra = config.pop("extra_special_tokens", None)
    if isinstance(extra, list):
        config["additional_special_tokens"] = extra
    elif extra:
        config["extra_special_tokens"] = extra
    if not (out / "chat_template.jinja").is_file() and tokenizer.chat_template:
        config["chat_template"] = tokenizer.chat_template
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF into an fp32 safetensors model.

    `from_pretrained(gguf_file=...)` needs accelerate (not a dependency) and its model refuses
    `save_pretrained`, so: config from the GGUF, a fresh model built from it, the dequantized
    tensors loaded into that model, then an ordinary save.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    started = time.monotonic()
    log.info("converting %s to safetensors in %s (once; about a minute)", gguf.name, out)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    log.info("dequantizing %s", gguf)
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    # With tied embeddings the GGUF has no output matrix; lm_head shares embed_tokens.
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise ConfigError(
            f"GGUF {gguf} does not match its config: missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)}"
        )
    model.tie_weights()
    log.info("loaded %d tensors in %.1f s; saving", len(tensors), time.monotonic() - started)
    model.eval().save_pretrained(out)
    _add_sampling_defaults(out, SMOLLM2_SAMPLING)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if tokenizer.chat_template in (None, "", SMOLLM2_GGUF_TEMPLATE):
        tokenizer.chat_template = SMOLLM2_TEMPLATE
    _save_tokenizer(tokenizer, out, max_length=config.max_position_embeddings)
    log.info("converted %s in %.1f s", gguf.name, time.monotonic() - started)
