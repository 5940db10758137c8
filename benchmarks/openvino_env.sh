#!/usr/bin/env bash
# Create .venv-openvino: OpenVINO GenAI 2026.4 (the CPU runtime with KV-cache eviction) and
# optimum-intel 2.2 to export the converted checkpoint to OpenVINO IR once, for
# `cake bench speed --openvino`. optimum-intel pins transformers < 5.6, so it cannot share the
# project's venv; torch (which the export traces) keeps the project's pin, the CPU wheel first.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv-openvino/bin/python ] || python3 -m venv .venv-openvino
pip_install() { .venv-openvino/bin/python -m pip install -q "$@" 2> >(grep -v "^WARNING: Location" >&2); }
pip_install --upgrade pip
pip_install --timeout 15 --retries 0 --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0" 2>/dev/null \
  || pip_install "torch==2.13.0"
pip_install "openvino-genai==2026.4.1.0" "openvino-tokenizers==2026.4.1.0" "optimum-intel[openvino]==2.2.0" \
  "transformers>=4.51,<5.6" "torch==2.13.0"
# optimum-intel pulls torchvision, whose PyPI build does not match the CPU torch (its operators fail to
# register and transformers then cannot import its models); nothing here uses it
.venv-openvino/bin/python -m pip uninstall -y -q torchvision
.venv-openvino/bin/python -c "from transformers import PreTrainedModel; import openvino_genai, transformers; print('openvino-genai', openvino_genai.__version__, 'transformers', transformers.__version__)"
