#!/usr/bin/env bash
# Set up with the test and bench extras (bench: the benchmark data the data-builder tests read), check
# style (ruff, pinned in the `test` extra), then run the whole test suite (CPU, offline). Skipped tests
# are listed with their reasons (-ra in pyproject.toml). Extra arguments go to pytest, e.g.
# `bash scripts/test.sh -m "not real_model"`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test,bench
. .venv/bin/activate 2>/dev/null || true
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
ruff check .
ruff format --check .
python -m pytest -q "$@"
