"""Two models (or one model in two dtypes or weight formats) on the same real-set questions: exact accuracy
on the answerable ones, paired by question.

Reads two `cake bench quality --suite real` run files (one per model, the same documents) and prints, for each
cell (method at budget) both files hold, the answerable questions both answered, each model's exact accuracy
and the second model's minus the first's with a paired bootstrap interval by question (`bench.bootstrap`), then
the second model at its smallest budget against the first at its largest: the pairing that asks whether the
larger model with less KV memory still answers more. Scores are those stored in the files (both must have been
scored with the same `--abstain` mode, which is checked).

    python benchmarks/model_versus.py benchmarks/runs/real-heldout-qwen0.5b-whole-chunk.json \
        benchmarks/runs/real-heldout-qwen1.5b-whole.json --methods full,cake-chunk
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cake_cli.bench.bootstrap import paired_interval
from cake_cli.bench.quality.abstention import ANSWERABLE_TASKS
from cake_cli.bench.quality.report import interval_cell


def answerable_exact(run: dict, method: str, budget: int | None) -> dict[str, float]:
    """case id -> exact (0/1) of `method` at `budget` (None: the full cache) on the answerable questions."""
    return {
        r["case_id"]: float(r["exact"])
        for r in run["rows"]
        if r["method"] == method and r["budget"] == budget and r["task"] in ANSWERABLE_TASKS
    }


def versus_line(first: dict[str, float], second: dict[str, float], label: str, names: tuple[str, str]) -> str:
    """One line: both models' exact accuracy on the questions both answered and the paired difference (points).

    Raises:
        ValueError: no question in common.
    """
    common = sorted(set(first) & set(second))
    if not common:
        raise ValueError(f"{label}: the two runs share no answerable question")
    a, b = [first[q] for q in common], [second[q] for q in common]
    return (
        f"{label}: {len(common)} answerable questions, {names[0]} {100 * sum(a) / len(a):.1f}, "
        f"{names[1]} {100 * sum(b) / len(b):.1f}, {names[1]} - {names[0]} {interval_cell(paired_interval(b, a))}"
    )


def run_names(runs: list[dict], given: str = "") -> tuple[str, str]:
    """The two runs' names in the lines: `given` ("FIRST,SECOND") if set, else each run's model, and
    when both ran one model, the model with each run's dtype and weights ("m float32+w8a8").

    Raises:
        ValueError: `given` is not two comma-separated names.
    """
    if given:
        names = tuple(n.strip() for n in given.split(","))
        if len(names) != 2 or not all(names):
            raise ValueError(f"--names takes two names, FIRST,SECOND (got {given!r})")
        return names
    names = tuple(run["meta"]["model"].split(" (")[0] for run in runs)  # "qwen2.5-coder-0.5b (Qwen2.5-…)"
    if names[0] == names[1]:
        names = tuple(
            f"{n} {run['meta'].get('dtype')}+{run['meta'].get('weights')}" for n, run in zip(names, runs, strict=True)
        )
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path, help="run file of the first model")
    parser.add_argument("second", type=Path, help="run file of the second model")
    parser.add_argument("--methods", default="full,cake-chunk", help="methods compared, comma-separated")
    parser.add_argument(
        "--names", default="", help="FIRST,SECOND: the runs' names in the lines (default: from the files)"
    )
    args = parser.parse_args()
    runs = [json.loads(p.read_text()) for p in (args.first, args.second)]
    modes = [run["meta"].get("abstain") for run in runs]
    if modes[0] != modes[1]:
        raise SystemExit(f"error: the runs were scored with --abstain {modes[0]} and {modes[1]}; merge one again")
    try:
        names = run_names(runs, args.names)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    print(f"exact x 100 on answerable questions, scored with --abstain {modes[0]}; * lower bound >= 0")
    for method in args.methods.split(","):
        budgets = sorted({r["budget"] for run in runs for r in run["rows"] if r["method"] == method},
                         key=lambda b: (b is not None, b or 0))  # fmt: skip
        for budget in budgets:
            cells = [answerable_exact(run, method, budget) for run in runs]
            if all(cells):
                print(versus_line(*cells, f"{method} B={budget or '-'}", names))
        sized = [b for b in budgets if b is not None]
        if len(sized) > 1:
            small, large = min(sized), max(sized)
            cells = [answerable_exact(runs[0], method, large), answerable_exact(runs[1], method, small)]
            if all(cells):
                print(versus_line(*cells, f"{method}: {names[1]} at B={small} vs {names[0]} at B={large}", names))


if __name__ == "__main__":
    main()
