"""`cake qa --prefill select` against the full prefill: time to the first token, side by side in one run.

The same qa run (the Python docs text the speed benchmark uses, cut to `--length` tokens, one
question, CAKE at `--budget`) through the task runner as `cake qa` runs it, with the normal prefill and
with `--prefill select`, alternating, `--repeats` times each on one loaded model; prints each run's
prefill seconds (the selection's cut-off forward included), tokens the model read, and the answer, then
the median ratio. Timing only: whether the answers hold is the real set's job (`cake bench quality`).

    python benchmarks/prefill_select.py --length 8192 --repeats 2

Prints Markdown on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from cake_cli.bench.corpus import python_docs_text
from cake_cli.tasks.planning import plan
from cake_cli.tasks.request import TaskRequest
from cake_cli.tasks.runner import ready_model, run_task

QUESTION = "What happens to assert statements when Python runs with optimization requested (-O)?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="model name or path (default: the embedded default)")
    parser.add_argument("--length", type=int, default=8192, help="document tokens")
    parser.add_argument("--budget", type=int, default=1024, help="B, tokens per layer (the CLI's default)")
    parser.add_argument("--select-tokens", type=int, default=None, help="--select-tokens (default 4 x B)")
    parser.add_argument("--select-layer", type=int, default=None, help="--select-layer (default GemFilter's depth)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each mode (alternating)")
    args = parser.parse_args()
    base = TaskRequest(task="qa", document="-", model=args.model, weights="auto")
    ready = ready_model(base)
    tokenizer = ready.loaded.tokenizer
    ids = tokenizer(python_docs_text(), add_special_tokens=False)["input_ids"][: args.length]
    rows: dict[str, list] = {"full": [], "select": []}
    with tempfile.TemporaryDirectory() as tmp:
        doc = Path(tmp) / "doc.txt"
        doc.write_text(tokenizer.decode(ids), encoding="utf-8")
        for r in range(args.repeats):
            for mode in rows:
                print(f"{mode}, run {r + 1}/{args.repeats}", file=sys.stderr)
                request = TaskRequest(
                    task="qa", document=str(doc), fields={"question": QUESTION}, model=args.model, budget=args.budget,
                    weights="auto", prefill=mode, select_tokens=args.select_tokens if mode == "select" else None,
                    select_layer=args.select_layer if mode == "select" else None,
                )  # fmt: skip
                rows[mode].append(run_task(plan(request), model=ready))
    first = rows["full"][0]
    print(f"model {first.model} · {first.dtype} · weights {first.weights} · B = {args.budget} · "
          f"{first.prompt_tokens}-token prompt · threads {first.prefill_threads}/{first.decode_threads}\n")  # fmt: skip
    print("| mode | run | prefill s (selection included) | tokens read | selected at layer | answer |")
    print("|---|---|---|---|---|---|")
    for mode, results in rows.items():
        for i, r in enumerate(results, 1):
            sel = r.selected
            read = sel.kept_tokens if sel else r.prompt_tokens
            layer = f"{sel.layer} ({sel.seconds:.2f} s)" if sel else "–"
            answer = r.answer.replace("|", "/").replace("\n", " ")[:80]
            print(f"| {mode} | {i} | {r.prefill_seconds:.2f} | {read} | {layer} | {answer} |")
    full = statistics.median(r.prefill_seconds for r in rows["full"])
    select = statistics.median(r.prefill_seconds for r in rows["select"])
    print(f"\nmedian prefill: full {full:.2f} s, select {select:.2f} s: select takes {select / full:.2f}x the time")


if __name__ == "__main__":
    main()
