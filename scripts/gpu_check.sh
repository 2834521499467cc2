#!/usr/bin/env bash
# GPU check of the vLLM deploy paths: on a machine with an NVIDIA GPU, builds vLLM's CUDA
# environment if needed (make vllm-venv), serves a >=0.5B model (MODEL_DIR, or a random 0.6B
# Llama built locally), loads one LoRA and syncs one full-weight release over NCCL, and prints
# seconds and GB/s as JSON. Takes a few minutes once vLLM is installed.
#   scripts/gpu_check.sh [MODEL_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi -L >/dev/null 2>&1 || { echo "gpu_check: no NVIDIA GPU here (nvidia-smi)"; exit 2; }
VENV=${VLLM_VENV:-.venv-vllm}
[ -f "$VENV/.installed" ] || make vllm-venv VLLM_VENV="$VENV"
exec timeout 600 "$VENV/bin/python" scripts/gpu_check.py "$@"
