#!/usr/bin/env bash
# Create .venv-kvpress: NVIDIA's kvpress 0.5.5 (it pins transformers < 5.3, so it cannot share the
# project's venv) with the same torch pin as the project, for `cake bench speed --kvpress`.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv-kvpress/bin/python ] || python3 -m venv .venv-kvpress
.venv-kvpress/bin/python -m pip install -q --upgrade pip 2> >(grep -v "^WARNING: Location" >&2)
# torch first and pinned (the CPU wheel where it exists), then kvpress and what it needs
.venv-kvpress/bin/python -m pip install -q "torch==2.13.0" 2> >(grep -v "^WARNING: Location" >&2)
.venv-kvpress/bin/python -m pip install -q "kvpress==0.5.5" 2> >(grep -v "^WARNING: Location" >&2)
.venv-kvpress/bin/python -c "import kvpress, transformers, torch; print('kvpress', kvpress.__version__ if hasattr(kvpress, '__version__') else '0.5.5', 'transformers', transformers.__version__, 'torch', torch.__version__)"
