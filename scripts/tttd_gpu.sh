#!/usr/bin/env bash
# TTT-Discover on circle packing at scale: N = 26 circles, a larger model served by vLLM behind
# Reef, the tttd recipe training a LoRA step per grid. Prints one JSON line per finished step
# ({"arm": "ttt", "step": s, "best": Σr, "mean_reward": …}) and a summary line.
#
#   scripts/tttd_gpu.sh            # GPU + vLLM (make vllm-venv first; TTTD_MODEL a local model dir)
#   scripts/tttd_gpu.sh --cpu      # the same path on CPU: tiny model, tiny grid (what CI tests)
#
# Sizes (env): TTTD_MODEL, TTTD_N (26), TTTD_GROUPS (8), TTTD_ROLLOUTS (64: the published grid),
# TTTD_STEPS (50), TTTD_MAX_TOKENS (8192; the paper's 26,000 needs a long-context model),
# TTTD_TIMEOUT (program seconds, 120), TTTD_LR (4e-5), TTTD_LORA_R (32), TTTD_ARMS (ttt),
# TTTD_TEMPERATURE (1.0, §3.3).
# Published anchors: 2.635983 (N = 26), 2.939573 (N = 32), the TTT-Discover paper
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}

if [[ "${1:-}" == "--cpu" ]]; then
    exec "$PYTHON" -m demo.discover --json --engine embedded --model "${TTTD_MODEL:-tiny}" \
        --n "${TTTD_N:-4}" --groups "${TTTD_GROUPS:-2}" --rollouts "${TTTD_ROLLOUTS:-3}" \
        --steps "${TTTD_STEPS:-1}" --max-tokens "${TTTD_MAX_TOKENS:-16}" \
        --timeout "${TTTD_TIMEOUT:-20}" --lr "${TTTD_LR:-4e-5}" --lora-r "${TTTD_LORA_R:-4}" \
        --temperature "${TTTD_TEMPERATURE:-1.0}" --arms "${TTTD_ARMS:-ttt}" ${TTTD_STATE_DIR:+--state-dir "$TTTD_STATE_DIR"}
fi

command -v nvidia-smi >/dev/null || { echo "no GPU (nvidia-smi): use --cpu" >&2; exit 2; }
[[ -x .venv-vllm/bin/python ]] || { echo "vLLM's environment is missing: make vllm-venv" >&2; exit 2; }
: "${TTTD_MODEL:?set TTTD_MODEL to a local model directory (e.g. Qwen3-8B), as engine.model}"
exec "$PYTHON" -m demo.discover --json --engine vllm --model "$TTTD_MODEL" \
    --n "${TTTD_N:-26}" --groups "${TTTD_GROUPS:-8}" --rollouts "${TTTD_ROLLOUTS:-64}" \
    --steps "${TTTD_STEPS:-50}" --max-tokens "${TTTD_MAX_TOKENS:-8192}" \
    --timeout "${TTTD_TIMEOUT:-120}" --lr "${TTTD_LR:-4e-5}" --lora-r "${TTTD_LORA_R:-32}" \
    --temperature "${TTTD_TEMPERATURE:-1.0}" --arms "${TTTD_ARMS:-ttt}" ${TTTD_STATE_DIR:+--state-dir "$TTTD_STATE_DIR"}
