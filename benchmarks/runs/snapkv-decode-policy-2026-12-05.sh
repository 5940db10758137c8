#!/usr/bin/env bash
# SnapKV at B = 128 on the default model through `cake qa`, as a user runs it: three facts planted in
# CPython's statistics.py (about 1.3K tokens), float32 and bfloat16 prefill, the decode policy our
# baselines use (fixed: one held token evicted per generated token) against the one SnapKV's and
# kvpress's code use (grow: nothing evicted after prefill), and the full cache. Prints one line per
# run: dtype, method, policy, question, whether the reply holds the fact, the reply.
set -uo pipefail
cd "$(dirname "$0")/../.."
doc=$(mktemp --suffix=.txt)
python - "$doc" <<'PY'
import statistics, sys
text = open(statistics.__file__).read()[:5000]
facts = ["\n# Note: the archive access code is 4817.\n", "\n# Note: the maintenance window starts at 03:40 on Tuesdays.\n",
         "\n# Note: the project's internal codename is BLUE HERON.\n"]
cut = [int(len(text) * f) for f in (0.2, 0.5, 0.8)]
parts, last = [], 0
for c, fact in zip(cut, facts):
    c = text.index("\n", c)
    parts += [text[last:c], fact]
    last = c
open(sys.argv[1], "w").write("".join(parts) + text[last:])
PY
questions=("What is the archive access code?|4817" "When does the maintenance window start?|03:40" "What is the project's internal codename?|BLUE HERON")
for run in "float32 snapkv fixed" "float32 snapkv grow" "bfloat16 snapkv fixed" "bfloat16 snapkv grow" \
    "float32 full grow" "bfloat16 full grow"; do
    set -- $run; dtype=$1; shift
    for qa in "${questions[@]}"; do
      q=${qa%|*}; gold=${qa#*|}
      reply=$(timeout 600 python -m cake_cli qa "$doc" "$q" --method "$1" -b 128 --decode-policy "$2" --dtype "$dtype" \
        --weights bf16 --threads 2 -n 24 -q 2>&1 | tr '\n' ' ')
      hit=no; [[ "$reply" == *"$gold"* ]] && hit=yes
      echo "$dtype | $1 | $2 | $q | found: $hit | $reply"
    done
done
rm -f "$doc"
