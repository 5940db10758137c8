"""What an embedded model costs in CAKE_HOME: the one-time conversion (seconds, peak memory), the disk
it takes against its GGUF, and the warm load (`load` in the report), each load in a process of its own.

    python benchmarks/lean_weights.py --model qwen2.5-coder-0.5b --repeats 3

A fresh CAKE_HOME (a temporary folder, or `--home`) is used, so the first load converts; the
conversion's peak memory is the child process's largest anonymous resident set (sampled every
50 ms: the GGUF's and the written file's pages are file pages, not counted) and its peak resident
set (VmHWM, file pages included). Prints one line per measurement and the PASS/FAIL lines of the
issue's targets (disk <= 2x the GGUF, load <= `--load-target` s, first load <= `--convert-target` s).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, re, sys, threading, time
peak = [0]
def watch():
    while True:
        text = open("/proc/self/status").read()
        peak[0] = max(peak[0], int(re.search(r"RssAnon:\s+(\d+)", text).group(1)))
        time.sleep(0.05)
threading.Thread(target=watch, daemon=True).start()
t0 = time.perf_counter()
from cake_cli.models.loader import load_model
lm = load_model(sys.argv[1], weights=sys.argv[2])
wall = time.perf_counter() - t0
hwm = int(re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read()).group(1))
print(json.dumps({"load_seconds": lm.load_seconds, "wall": wall, "anon_peak_kb": peak[0], "hwm_kb": hwm,
                  "weights": lm.weights, "dtype": str(lm.dtype)}))
"""


def child(model: str, weights: str, home: Path) -> dict:
    env = {**os.environ, "CAKE_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", CHILD, model, weights], env=env, capture_output=True, text=True)
    if out.returncode:
        sys.exit(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"child exited {out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def disk(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--weights", default="auto")
    parser.add_argument("--repeats", type=int, default=3, help="warm loads after the conversion")
    parser.add_argument("--home", type=Path, default=None, help="CAKE_HOME to use (default: a fresh temporary one)")
    parser.add_argument("--load-target", type=float, default=2.0, help="seconds a warm load may take")
    parser.add_argument("--convert-target", type=float, default=35.0, help="seconds the first load may take")
    args = parser.parse_args()
    from cake_cli.models.embedded import EMBEDDED_MODELS
    from cake_cli.models.profiles import profile_of

    em = EMBEDDED_MODELS[profile_of(args.model).embedded]
    with tempfile.TemporaryDirectory(prefix="cake-home-") as tmp:
        home = args.home or Path(tmp)
        first = child(args.model, args.weights, home)
        print(
            f"first load (converts): {first['load_seconds']:.1f} s · peak anonymous memory "
            f"{first['anon_peak_kb'] / 1024:.0f} MiB · peak resident {first['hwm_kb'] / 1024:.0f} MiB · "
            f"{first['weights']} weights, {first['dtype']}"
        )
        used = disk(home / "models")
        ratio = used / em.gguf_size
        print(f"CAKE_HOME models: {used / 1e6:.0f} MB for a {em.gguf_size / 1e6:.0f} MB GGUF ({ratio:.2f}x)")
        for folder in sorted((home / "models").iterdir()):
            print(f"  {folder.name}: {disk(folder) / 1e6:.0f} MB")
        loads = [child(args.model, args.weights, home)["load_seconds"] for _ in range(args.repeats)]
        print("warm loads: " + ", ".join(f"{s:.2f} s" for s in loads))
        worst = max(loads) if loads else float("nan")
        print(f"{'PASS' if ratio <= 2 else 'FAIL'} disk {ratio:.2f}x the GGUF (target <= 2x)")
        verdict = "PASS" if worst <= args.load_target else "FAIL"
        print(f"{verdict} warm load {worst:.2f} s (target <= {args.load_target} s)")
        took = first["load_seconds"]
        verdict = "PASS" if took <= args.convert_target else "FAIL"
        print(f"{verdict} conversion (first load) {took:.1f} s (target <= {args.convert_target} s)")


if __name__ == "__main__":
    main()
