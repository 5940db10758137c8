#!/usr/bin/env bash
# The one-time conversion of an embedded model, two source trees alternating in one run, each load in a
# fresh CAKE_HOME and a process of its own (the first load converts); prints the seconds and the load average.
# Usage: bash benchmarks/lean_conversion_ab.sh MODEL ROUNDS BEFORE_TREE AFTER_TREE
#   e.g. git worktree add --detach /tmp/before 4989b26
#        bash benchmarks/lean_conversion_ab.sh qwen2.5-coder-0.5b 3 /tmp/before .
set -euo pipefail
model=$1 rounds=$2
export HF_HUB_OFFLINE=1
for r in $(seq 1 "$rounds"); do
  for tree in "$3" "$4"; do
    home=$(mktemp -d)
    took=$(cd "$tree" && CAKE_HOME=$home PYTHONPATH=$PWD python -c "
from cake_cli.models.loader import load_model
print(f\"{load_model('$model', weights='auto').load_seconds:.1f}\")" 2>/dev/null | tail -1)
    echo "$model round $r $tree: first load (converts) $took s; load avg $(cut -d' ' -f1 /proc/loadavg)"
    rm -rf "$home"
  done
done
