#!/usr/bin/env bash
# GPU check (not run in CI: needs CUDA). Runs the tasks with --device-map auto (accelerate places
# the layers) and checks that CAKE works there: exit 0, an answer on stdout and the report on
# stderr, the budgets summing to (B - w)·L within L, and the JSON saying cuda.
# With two or more GPUs it also runs --device-map balanced, which splits even a small model's
# layers across the GPUs: the path where each layer's cache, indicator and index tensors live on
# that layer's device. (A model that fits one GPU stays on cuda:0 under "auto"; accelerate's
# "cpu" entries in a GPU map are offloaded weights that still execute on the GPU, so one GPU
# cannot exercise a real split.)
#
# Usage: bash scripts/gpu_check.sh [MODEL]     (default: the embedded smollm2; e.g. mistral)
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate 2>/dev/null || true
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
model="${1:-smollm2}"
doc="$(python -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')/LICENSE.txt"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

python - <<'PY'
import torch, sys
if not torch.cuda.is_available():
    sys.exit("gpu_check: CUDA is not available on this machine")
print(f"gpu_check: {torch.cuda.device_count()} CUDA device(s): "
      + ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())), file=sys.stderr)
PY
cake env

check() {  # check NAME JSONFILE: exit 0 already; the JSON must say cuda and the budgets must add up
  python - "$1" "$2" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
d = json.load(open(path))
L, B, w = len(d["layers"]), d["budget"], d["window"]
assert d["device"].startswith("cuda"), f"{name}: ran on {d['device']}"
if d["evicted"]:
    total = sum(layer["budget"] for layer in d["layers"])
    assert (B - w) * L - L <= total <= (B - w) * L, f"{name}: budgets sum to {total}, want (B-w)L={(B - w) * L}"
answer = d.get("answer", "")
print(f"gpu_check {name}: ok · {d['device']} {d['dtype']} {d['attention']} · prompt {d['prompt_tokens']} · "
      f"saved {d['saved_fraction']:.1%} · answer {answer[:80]!r}", file=sys.stderr)
PY
}

for attention in auto sdpa eager; do
  cake summarize "$doc" --model "$model" --device-map auto --attention "$attention" --budget 256 -n 48 --json \
    > "$out/summarize-$attention.json"
  check "summarize/$attention" "$out/summarize-$attention.json"
done
cake qa "$doc" "Who holds the copyright of Python?" --model "$model" --device-map auto --budget 256 -n 32 --json \
  > "$out/qa.json"
check qa "$out/qa.json"
cake inspect-layers "$doc" --model "$model" --device-map auto --budget 256 --json > "$out/inspect.json"
check inspect-layers "$out/inspect.json"
# streamed (not JSON): the answer on stdout, the report on stderr
cake summarize "$doc" --model "$model" --device-map auto --budget 256 -n 48 > "$out/summary.txt" 2> "$out/report.txt"
test -s "$out/summary.txt" && grep -q "CAKE report" "$out/report.txt"
# where did accelerate put the layers? (several devices means the multi-device path ran)
placement() {
  python - "$model" "$1" <<'PY'
import sys
from cake_cli.models.loader import load_model
loaded = load_model(sys.argv[1], device_map=sys.argv[2])
devices = sorted({str(p.device) for p in loaded.model.parameters()})
print(f"gpu_check: --device-map {sys.argv[2]} placed the weights on {', '.join(devices)}", file=sys.stderr)
print(len(devices))
PY
}
placement auto > /dev/null
gpus="$(python -c 'import torch; print(torch.cuda.device_count())')"
if [ "$gpus" -ge 2 ]; then
  test "$(placement balanced)" -ge 2
  cake summarize "$doc" --model "$model" --device-map balanced --budget 256 -n 48 --json > "$out/balanced.json"
  check summarize/balanced "$out/balanced.json"
  cake inspect-layers "$doc" --model "$model" --device-map balanced --budget 256 --json > "$out/inspect-balanced.json"
  check inspect-layers/balanced "$out/inspect-balanced.json"
else
  echo "gpu_check: one GPU: the split-across-GPUs check (--device-map balanced) was skipped" >&2
fi
echo "gpu_check: all checks passed" >&2
