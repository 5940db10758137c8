#!/usr/bin/env bash
# Set up with the test extras, then run the whole test suite (CPU, offline; about 5 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
. .venv/bin/activate 2>/dev/null || true
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
python -m pytest -q "$@"
