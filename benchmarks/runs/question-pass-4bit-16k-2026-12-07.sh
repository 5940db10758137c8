#!/usr/bin/env bash
# The question-time pass of `cake qa FILE.cake Q` from a 16-bit and a 4-bit (format 6) whole-prefix file of
# the same ~16K-token prefix, alternating, fresh processes; prints each run's pass line.
# Usage: bash question-pass-4bit-16k-2026-12-07.sh REPEATS [NEW_TOKENS]   (in the folder holding doc16k.cake and doc16k-4bit.cake)
set -euo pipefail
# the document, once:  python -c "from pydoc_data.topics import topics; open('doc16k.txt', 'w').write(
#   '\n\n'.join(topics[k] for k in sorted(topics))[:70800])"
#   cake compress doc16k.txt -o doc16k.cake ; cake compress doc16k.txt --kv-bits 4 -o doc16k-4bit.cake
q='What does the document say about the numbers that follow a decimal point?'
for r in $(seq 1 "${1:-5}"); do
  for f in doc16k.cake doc16k-4bit.cake; do
    line=$(cake qa "$f" "$q" --max-new-tokens "${2:-4}" 2>&1 | grep -o 'prefill of the [0-9]* task tokens [0-9.]* s[^│]*' | head -1)
    echo "$f run $r: $line"
  done
done

# the per-layer dequantization of a loaded layer after an eviction to 1,024 slots (python, run alone):
python - <<'EOF'
import time, torch
from cake_cli.engine import kvquant as kq
from cake_cli.engine.kvmemory import QuantLayer
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
L = 16000
k, v = (torch.randn(2, L, 64, generator=g).to(torch.bfloat16) for _ in range(2))
for vg, rot in ((32, False), (64, True)):
    keys = kq.quantize_entry(k, "keys", 4, 32, 32, 4)
    values = kq.quantize_entry(v, "values", 4, vg, 32, 4, rotated=rot)
    layer = QuantLayer.from_parts({"keys": dict(keys), "values": dict(values)}, torch.arange(L).expand(2, L), L, 4, 32, value_group=vg, rotated=rot)
    keep = torch.stack([(torch.randperm(L - 4, generator=g)[:1020] + 4).sort().values for _ in range(2)])
    keep = torch.cat([torch.arange(4).expand(2, -1), keep], 1)
    layer.keep(keep)
    for _ in range(10): layer.whole()
    ts = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(24): layer.whole()
        ts.append((time.perf_counter() - t) * 1e3)
    print(f"value group {vg} rotated {rot}: whole() of 24 layers of 1024 kept slots: {sorted(ts)[3]:.1f} ms")
EOF
