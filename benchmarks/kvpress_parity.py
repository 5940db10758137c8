"""Our SnapKV and PyramidKV against kvpress's `SnapKVPress` and `PyramidKVPress` on the same inputs:
which prompt positions each layer and KV head keeps after prefill, in float32 and bfloat16.

    python benchmarks/kvpress_parity.py [--real-model DIR --doc FILE --real-tokens 2048]

Needs .venv-kvpress (benchmarks/kvpress_env.sh): kvpress runs there, in a subprocess
(benchmarks/kvpress_parity_press.py); the two sides exchange only a model folder (config.json +
safetensors), the prompt (safetensors) and JSON. The model is a tiny random Qwen2 (fixed seed, 4
layers, 8 query / 2 KV heads) and, with --real-model, a real checkpoint folder on a document excerpt
followed by a question (the last tokens, so the observation window holds it, as in the real set).

Each case pairs one of our configurations with one kvpress press at the same budget B (tokens per
layer, window included):
  snapkv-scoring    our uniform allocation with kvpress's SnapKV score (window mean, avg-pool 5: our
                    `cake` indicator at gamma 0, avg 5) vs SnapKVPress(window 32, kernel 5): the
                    mechanics (window attention, GQA mean, window kept, top-k, count) alone;
  snapkv-shipped    our `snapkv` (window 32, max-pool 7) vs SnapKVPress's defaults (window 64, kernel 5);
  pyramidkv-scoring our `pyramid` allocation with kvpress's score vs PyramidKVPress(window 32, kernel 5):
                    the per-layer budgets alone;
  pyramidkv-shipped our `pyramidkv` vs PyramidKVPress's defaults (window 64, kernel 5).
SnapKVPress keeps int(n · (1 - ratio)) tokens; the ratio passed is 1 - (B + 0.5) / n, which keeps B.
PyramidKVPress's mean kept per layer is n · (1 - ratio) = B (its ratio: 1 - B / n).

Printed per case, budget and dtype: per layer, the tokens each side kept (ours/kvpress), the Jaccard
index of the two kept sets for each KV head, how many heads kept exactly the same set, and how many
are nested (the smaller set inside the larger: the same ranking cut at another count). Then the
drift between float32 and bfloat16 prefill for each side and configuration.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM
from transformers.utils import logging as hf_logging

from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.replay import record, replay

ROOT = Path(__file__).resolve().parent.parent
KVPRESS_PYTHON = ROOT / ".venv-kvpress" / "bin" / "python"
DTYPES = ("float32", "bfloat16")
QUESTION = "\n\nQuestion: what does this part of the document say the function returns? Answer briefly."

# name: (our CakeConfig fields, kvpress press, window_size, kernel_size)
MEAN_AVG5 = {"indicator": "cake", "gamma": 0.0, "pool_kind": "avg", "pool_kernel": 5, "window": 32}
CASES = {
    "snapkv-scoring": ({"allocation": "uniform", **MEAN_AVG5}, "snapkv", 32, 5),
    "snapkv-shipped": ({"allocation": "uniform", "indicator": "snapkv", "window": 32}, "snapkv", 64, 5),
    "pyramidkv-scoring": ({"allocation": "pyramid", **MEAN_AVG5}, "pyramidkv", 32, 5),
    "pyramidkv-shipped": ({"allocation": "pyramid", "indicator": "snapkv", "window": 32}, "pyramidkv", 64, 5),
}


def tiny_model(folder: Path, n: int, seed: int = 0) -> None:
    """Save a random Qwen2-shaped model (4 layers, 8 / 2 heads, head dim 16) and an n-token random prompt.
    initializer_range 0.2 makes the attention peaked enough that the ranking is not all near-ties."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=1024,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        initializer_range=0.2,
        tie_word_embeddings=False,
    )
    Qwen2ForCausalLM(config).save_pretrained(folder)
    save_file({"input_ids": torch.randint(3, 1024, (1, n))}, str(folder / "prompt.safetensors"))


def real_prompt(model_dir: Path, doc: Path, tokens: int, out: Path) -> int:
    """The first `tokens` tokens of `doc` and QUESTION, saved to `out`; returns the prompt length."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    body = tokenizer(doc.read_text(errors="replace"), add_special_tokens=False)["input_ids"][:tokens]
    ids = body + tokenizer(QUESTION, add_special_tokens=False)["input_ids"]
    save_file({"input_ids": torch.tensor([ids])}, str(out))
    return len(ids)


def pyramidkv_code_budgets(n: int, budget: int, window: int, layers: int, beta: int = 20) -> list[int]:
    """Tokens each layer keeps (window included) under the schedule of PyramidKV's own code
    (KVCache-Factory, `PyramidKVCluster.update_kv`, with max_capacity_prompt = B): the pyramid of the
    evictable budget c = B - w, its end points and step floored to integers, its top clipped to n - w;
    uniform c when n < 2c; nothing evicted when n < B. Written from that code's arithmetic, for the report."""
    c = budget - window
    if n < budget:
        return [n] * layers
    if n < 2 * c:
        return [budget] * layers
    low = c // beta
    high = 2 * c - low
    if high >= n - window:
        high = n - window
        low = 2 * c - high
    step = (high - low) // (layers - 1)
    return [high - layer * step + window for layer in range(layers)]


def ratio(press: str, budget: int, n: int) -> float:
    """kvpress's compression_ratio that keeps `budget` tokens per layer on average (see the module docstring)."""
    return 1.0 - ((budget + 0.5) if press == "snapkv" else budget) / n


def ours(model_dir: Path, prompt: Path, runs: list[tuple[str, str, dict, int]]) -> dict[str, list]:
    """Our prefill for each (key, dtype, CakeConfig fields, budget): [L][H_kv][k] kept positions, ascending.
    One recorded forward per dtype and window, each configuration's eviction replayed on it
    (`engine.replay`, the cascade code of a live prefill; tests/engine/test_replay.py checks them equal)."""
    ids = load_file(str(prompt))["input_ids"]
    out = {}
    for dtype in DTYPES:
        mine = [run for run in runs if run[1] == dtype]
        if not mine:
            continue
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
        use_cake_attention(model, "sdpa")
        for window in sorted({fields["window"] for _, _, fields, _ in mine}):
            recording = record(model, ids, window, accumulate=False)
            for key, _, fields, budget in mine:
                if fields["window"] == window:
                    state = replay(recording, CakeConfig(budget=budget, **fields))
                    out[key] = [layer.positions.sort(dim=-1).values.tolist() for layer in state.cache.layers]
    return out


def kvpress(model_dir: Path, prompt: Path, runs: list[dict], work: Path, threads: int) -> dict[str, list]:
    """kvpress's prefill for each run (benchmarks/kvpress_parity_press.py in .venv-kvpress)."""
    request, answer = work / "request.json", work / "kvpress.json"
    request.write_text(json.dumps({"model": str(model_dir), "prompt": str(prompt), "runs": runs}))
    script = ROOT / "benchmarks" / "kvpress_parity_press.py"
    cmd = [str(KVPRESS_PYTHON), str(script), "--request", str(request), "--out", str(answer), "--threads", str(threads)]
    subprocess.run(cmd, check=True)
    return {key: value["kept"] for key, value in json.loads(answer.read_text()).items()}


def compare(a: list, b: list) -> list[dict]:
    """Per layer: counts, per-head Jaccard, exact-equal heads and nested heads of two [L][H_kv][k] kept sets."""
    rows = []
    for layer_a, layer_b in zip(a, b, strict=True):
        jac, equal, nested = [], 0, 0
        for head_a, head_b in zip(layer_a, layer_b, strict=True):
            sa, sb = set(head_a), set(head_b)
            jac.append(len(sa & sb) / len(sa | sb))
            equal += sa == sb
            nested += sa <= sb or sb <= sa
        rows.append({"k": (len(layer_a[0]), len(layer_b[0])), "jaccard": jac, "equal": equal, "nested": nested})
    return rows


def summary(rows: list[dict]) -> str:
    heads = sum(len(r["jaccard"]) for r in rows)
    mean = sum(sum(r["jaccard"]) for r in rows) / heads
    return (
        f"mean Jaccard {mean:.3f}, equal heads {sum(r['equal'] for r in rows)}/{heads}, "
        f"nested {sum(r['nested'] for r in rows)}/{heads}, layers with equal counts "
        f"{sum(r['k'][0] == r['k'][1] for r in rows)}/{len(rows)}"
    )


def report(title: str, rows: list[dict], per_layer: bool) -> None:
    print(f"  {title}: {summary(rows)}")
    if per_layer:
        for i, r in enumerate(rows):
            jac = " ".join(f"{x:.3f}" for x in r["jaccard"])
            print(f"    L{i:02d} kept {r['k'][0]}/{r['k'][1]}  J {jac}  equal {r['equal']} nested {r['nested']}")


def run_model(
    label: str, model_dir: Path, prompt: Path, budgets: list[int], cases: list[str], work: Path, args
) -> None:
    n = load_file(str(prompt))["input_ids"].shape[1]
    print(f"\n## {label}: n = {n} prompt tokens, budgets {budgets}")
    our_runs, press_runs = [], []
    for case in cases:
        fields, press, window, kernel = CASES[case]
        for budget in budgets:
            for dtype in DTYPES:
                key = f"{case}|{budget}|{dtype}"
                our_runs.append((key, dtype, fields, budget))
                press_runs.append(
                    {
                        "key": key,
                        "dtype": dtype,
                        "press": press,
                        "window_size": window,
                        "kernel_size": kernel,
                        "compression_ratio": ratio(press, budget, n),
                    }
                )
    press_runs.sort(key=lambda r: r["dtype"])
    start = time.perf_counter()
    mine = ours(model_dir, prompt, our_runs)
    theirs = kvpress(model_dir, prompt, press_runs, work, args.threads)
    print(f"(both sides ran in {time.perf_counter() - start:.0f} s)")
    for case in cases:
        for budget in budgets:
            print(f"\n### {case}, B = {budget}")
            if CASES[case][1] == "pyramidkv":
                layers, window = len(mine[f"{case}|{budget}|float32"]), CASES[case][0]["window"]
                for side, counts in (
                    ("ours", [len(layer[0]) for layer in mine[f"{case}|{budget}|float32"]]),
                    ("kvpress", [len(layer[0]) for layer in theirs[f"{case}|{budget}|float32"]]),
                    (f"PyramidKV's code (w {window})", pyramidkv_code_budgets(n, budget, window, layers)),
                ):
                    print(f"  kept per layer, {side}: {counts} (sum {sum(counts)}, target {budget * layers})")
            for dtype in DTYPES:
                key = f"{case}|{budget}|{dtype}"
                report(f"ours vs kvpress, {dtype}", compare(mine[key], theirs[key]), args.per_layer)
            for side, kept in (("ours", mine), ("kvpress", theirs)):
                rows = compare(kept[f"{case}|{budget}|float32"], kept[f"{case}|{budget}|bfloat16"])
                report(f"{side}, float32 vs bfloat16", rows, False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny-tokens", type=int, default=2048, help="random prompt length for the tiny model")
    parser.add_argument("--tiny-budgets", default="128,256,768")
    parser.add_argument("--real-model", type=Path, help="a checkpoint folder (config.json + safetensors + tokenizer)")
    parser.add_argument("--doc", type=Path, help="a text document for --real-model")
    parser.add_argument("--real-tokens", type=int, default=2048, help="document tokens before the question")
    parser.add_argument("--real-budgets", default="128,768")
    parser.add_argument("--real-cases", default=",".join(CASES), help=f"cases for --real-model: {', '.join(CASES)}")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--per-layer", action="store_true", help="print every layer's row, not only the summary")
    args = parser.parse_args()
    if not KVPRESS_PYTHON.exists():
        sys.exit("error: .venv-kvpress is missing — run benchmarks/kvpress_env.sh first")
    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    print(f"torch {torch.__version__}; kvpress side: {KVPRESS_PYTHON}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tiny = work / "tiny"
        tiny_model(tiny, args.tiny_tokens)
        budgets = [int(b) for b in args.tiny_budgets.split(",")]
        label = "tiny random Qwen2 (4 layers, 8/2 heads, seed 0)"
        run_model(label, tiny, tiny / "prompt.safetensors", budgets, list(CASES), work, args)
        if args.real_model is not None:
            if args.doc is None:
                sys.exit("error: --real-model needs --doc FILE — give a text document")
            prompt = work / "real-prompt.safetensors"
            real_prompt(args.real_model, args.doc, args.real_tokens, prompt)
            budgets = [int(b) for b in args.real_budgets.split(",")]
            cases = args.real_cases.split(",")
            label = f"{args.real_model.name} on {args.doc.name}"
            run_model(label, args.real_model, prompt, budgets, cases, work, args)


if __name__ == "__main__":
    main()
