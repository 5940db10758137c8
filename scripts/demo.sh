#!/usr/bin/env bash
# Set up, then summarize a real ~3,400-token document (CPython's LICENSE.txt) with the embedded
# default model (Qwen2.5-Coder-0.5B-Instruct; the first run converts it once, ~40 s) at a budget of
# 512 tokens per layer (15% of its KV cache): the summary on stdout, the report on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate 2>/dev/null || true
doc="$(python -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')/LICENSE.txt"
cake summarize "$doc" --budget 512 "$@"
