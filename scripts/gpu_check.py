"""The vLLM deploy paths on a GPU, timed: one LoRA load and one NCCL full-weight sync into a
running CUDA vLLM serving a model of at least 0.5B parameters.

Run by scripts/gpu_check.sh with vLLM's environment (`make vllm-venv` installs the CUDA `vllm`
package and TRL where nvidia-smi finds a GPU). The model is MODEL_DIR when given (any Hugging
Face causal LM directory), else a random 0.6B Llama built here (no model hub needed). The NCCL
sync is reef/engines/vllm_sync.py, the sender Reef's vLLM engine runs; its GB/s is reported
next to the device's own device-to-device copy bandwidth. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch

ROOT = Path(__file__).resolve().parents[1]
SYNC = ROOT / "reef" / "engines" / "vllm_sync.py"


def random_llama(out: Path) -> Path:
    """A 0.6B Llama (random weights, bf16) with a byte-level tokenizer: no hub needed."""
    if (out / "config.json").is_file():
        return out
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens([chr(c) for c in range(32, 127)])
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>", "<|endoftext|>"])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=12,
        num_attention_heads=16,
        num_key_value_heads=16,
        max_position_embeddings=2048,
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    fast.save_pretrained(out)
    return out


def perturbed_copy(model_dir: Path, out: Path) -> int:
    """The model with every weight nudged (a stand-in for a trained release); returns bytes."""
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    size = 0
    for f in sorted(model_dir.glob("*.safetensors")):
        tensors = load_file(str(f), device="cuda")
        for t in tensors.values():
            t.add_(torch.randn_like(t) * 1e-3)
            size += t.numel() * t.element_size()
        save_file(tensors, str(out / f.name), metadata={"format": "pt"})
    for f in model_dir.iterdir():
        if f.suffix != ".safetensors" and f.is_file():
            (out / f.name).write_bytes(f.read_bytes())
    return size


def lora_adapter(model_dir: Path, out: Path, rank: int = 16) -> None:
    """A PEFT-format LoRA on q_proj/v_proj with random B (changes answers), written by hand."""
    from safetensors.torch import save_file

    config = json.loads((model_dir / "config.json").read_text())
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads")
    head_dim = config.get("head_dim") or hidden // heads
    outs = {"q_proj": heads * head_dim, "v_proj": (kv or heads) * head_dim}
    tensors = {}
    for i in range(layers):
        for mod, width in outs.items():
            key = f"base_model.model.model.layers.{i}.self_attn.{mod}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, hidden) * 0.01
            tensors[f"{key}.lora_B.weight"] = torch.randn(width, rank) * 0.01
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()},
        str(out / "adapter_model.safetensors"),
    )
    (out / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": rank,
                "lora_alpha": rank,
                "target_modules": list(outs),
                "bias": "none",
                "base_model_name_or_path": str(model_dir),
                "task_type": "CAUSAL_LM",
            }
        )
    )


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy GB/s (read + write counted once, as a sync moves each byte once)."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    torch.cuda.synchronize()
    return round(10 * nbytes / (time.perf_counter() - t0) / 1e9, 1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir", nargs="?", type=Path)
    p.add_argument("--work", type=Path, default=Path("/tmp/reef-gpu-check"))
    args = p.parse_args()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, object] = {"device": torch.cuda.get_device_name(0)}

    t0 = time.perf_counter()
    model_dir = args.model_dir or random_llama(work / "model")
    params = sum(_count(f) for f in model_dir.glob("*.safetensors"))
    report["model"] = {"dir": str(model_dir), "params_b": round(params / 1e9, 3)}
    report["copy_gb_per_s"] = copy_bandwidth()
    size = perturbed_copy(model_dir, work / "release")
    lora_adapter(model_dir, work / "adapter")
    report["prepare_s"] = round(time.perf_counter() - t0, 1)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_vllm(model_dir, port, work / "vllm.log")
    try:
        t0 = time.perf_counter()
        with httpx.Client(base_url=url, timeout=300) as c:
            wait_healthy(c, server, work / "vllm.log")
            report["vllm_start_s"] = round(time.perf_counter() - t0, 1)
            check_lora(c, work / "adapter", report)
            check_nccl(c, url, work / "release", report)
            check_reload(c, model_dir, report)
            report["bytes"] = size
    finally:
        server.terminate()
        server.wait(60)
    print(json.dumps(report, indent=2))
    return 0


# A short greedy request, answered the same way twice by the same weights.
CHAT = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8,
        "temperature": 0}  # fmt: skip


def start_vllm(model_dir: Path, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    """vLLM's OpenAI server on `model_dir` (served as "base"), with runtime LoRA loading and
    NCCL weight transfer enabled; its output in `log_path`."""
    env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_SERVER_DEV_MODE": "1"}
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", "base", "--port", str(port),
        "--enable-lora", "--max-lora-rank", "16", "--gpu-memory-utilization", "0.5",
        "--max-model-len", "2048", "--weight-transfer-config", '{"backend": "nccl"}',
    ]  # fmt: skip
    log = log_path.open("wb")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def wait_healthy(c: httpx.Client, server: subprocess.Popen[bytes], log_path: Path) -> None:
    """Until the server answers /health (SystemExit if it exits first)."""
    while True:
        if server.poll() is not None:
            raise SystemExit(f"vLLM exited: see {log_path}")
        try:
            if c.get("/health").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(1)


def check_lora(c: httpx.Client, adapter: Path, report: dict[str, object]) -> None:
    """The adapter loaded at run time (timed), then answering a request."""
    t0 = time.perf_counter()
    c.post("/v1/load_lora_adapter",
           json={"lora_name": "gpu@lora", "lora_path": str(adapter)}
           ).raise_for_status()  # fmt: skip
    report["lora_load_s"] = round(time.perf_counter() - t0, 3)
    c.post("/v1/chat/completions", json={**CHAT, "model": "gpu@lora"}).raise_for_status()


def check_nccl(c: httpx.Client, url: str, release: Path, report: dict[str, object]) -> None:
    """The full-weight release sent over NCCL by Reef's sender (timed, and its GB/s against
    the device's copy bandwidth), and the base's answer changed by it."""
    before = c.post("/v1/chat/completions", json={**CHAT, "model": "base"}).json()
    t0 = time.perf_counter()
    sync = subprocess.run(
        [sys.executable, str(SYNC), "--url", url, "--checkpoint", str(release),
         "--version", "gpu@full"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if sync.returncode != 0:
        raise SystemExit(f"NCCL sync failed:\n{sync.stdout}\n{sync.stderr}")
    report["nccl"] = json.loads(sync.stdout.strip().splitlines()[-1])
    report["nccl_total_s"] = round(time.perf_counter() - t0, 2)
    report["nccl_vs_copy"] = round(report["nccl"]["gb_per_s"] / report["copy_gb_per_s"], 3)  # type: ignore[index]
    report["weight_version"] = c.get("/weight_info").json()["weight_version"]
    after = c.post("/v1/chat/completions", json={**CHAT, "model": "base"}).json()
    report["answer_changed"] = (
        before["choices"][0]["message"]["content"] != after["choices"][0]["message"]["content"]
    )


def check_reload(c: httpx.Client, model_dir: Path, report: dict[str, object]) -> None:
    """The original weights reloaded from disk while serving is paused (timed)."""
    t0 = time.perf_counter()
    c.post("/pause", params={"mode": "wait"}).raise_for_status()
    c.post("/collective_rpc", json={"method": "reload_weights",
           "kwargs": {"weights_path": str(model_dir)}}).raise_for_status()  # fmt: skip
    c.post("/resume").raise_for_status()
    report["reload_s"] = round(time.perf_counter() - t0, 2)


def _count(f: Path) -> int:
    """Parameters in one safetensors file, from its header."""
    import math

    from safetensors import safe_open

    with safe_open(str(f), framework="pt") as h:
        return sum(math.prod(h.get_slice(k).get_shape()) for k in h.keys())  # noqa: SIM118


if __name__ == "__main__":
    sys.exit(main())
