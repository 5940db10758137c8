"""The abstention figures of real-suite runs, each rescored under every `--abstain` mode.

Each run file (`cake bench quality --suite real -o RUN.json`, any `--abstain`) is read, its
stored replies read and scored again as this code with each `--abstain` mode reads them
(`bench.quality.abstention.rescore`: nothing is decoded again), and one markdown row printed per
run x mode x method x budget: exact accuracy on the answerable questions, right abstentions on
the unanswerable ones, the share of right answers with a located passage and the right answers
(of `never`) the rule withholds. The command line is printed first, so the output can be kept as
a run file.

    python scripts/real_abstention.py benchmarks/runs/abstain-base-tune.json [...] [--modes never,unsupported]

`--thresholds 0.02,0.05,0.1` adds one row per threshold for the modes that set a stored check against
one (`checked`, `doubt`): the sweep a threshold is chosen from on the tune half. `--versus foreign` adds
a column: the right replies (exact answers and right abstentions, over all questions) of each row minus
those of the same method and budget under that mode, with its paired bootstrap interval by question
(`bench.bootstrap`, x 100; `*` where the lower bound is >= 0).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cake_cli.bench.bootstrap import paired_interval
from cake_cli.bench.quality.abstention import abstention_figures, rescore, rescore_inputs
from cake_cli.bench.quality.report import interval_cell
from cake_cli.tasks.answers.abstain import ABSTAIN_MODES, CHECKED, DOUBT, NEVER

HEADER = (
    "| run | --abstain | threshold | method | B | exact, answerable | right abstentions | right answers located "
    "| right answers lost to abstention |\n|---|---|---:|---|---:|---:|---:|---:|---:|"
)


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}% ({part}/{whole})" if whole else "n/a"


def right_replies(rows: list[dict], method: str, budget) -> dict[str, float]:
    """question id -> 1.0 where the reply is right (an exact answer, or an abstention where the document
    does not answer), else 0.0, for one method and budget."""
    return {r["case_id"]: float(r["exact"] >= 1.0) for r in rows if r["method"] == method and r["budget"] == budget}


def versus_cell(rows: list[dict], base: list[dict], method: str, budget) -> str:
    """The right replies of `rows` minus `base`'s, paired by question: 'mean [low, high]' x 100."""
    mine, theirs = right_replies(rows, method, budget), right_replies(base, method, budget)
    ids = sorted(mine)
    return interval_cell(paired_interval([mine[i] for i in ids], [theirs[i] for i in ids]))


def table(runs: list[Path], modes: list[str], thresholds: list[float] = (), versus: str = "") -> str:
    """The markdown table of every run x mode (x threshold, for a mode that reads one) x method x
    budget, with the column against `versus` where given (see the module docstring)."""
    loaded = [(path, json.loads(path.read_text())) for path in runs]
    texts, questions = rescore_inputs([r for _, data in loaded for r in data["rows"]])
    head, rule = HEADER.split("\n")
    lines = [f"{head} right replies - {versus} [95% CI] |\n{rule}---|" if versus else HEADER]  # one more column
    for path, data in loaded:
        cells = sorted({(r["method"], r["budget"]) for r in data["rows"]}, key=lambda c: (c[1] is not None, c))
        given = rescore(data["rows"], NEVER, texts, questions)
        base = rescore(data["rows"], versus, texts, questions) if versus else None
        for mode in modes:
            for threshold in (thresholds or [None]) if mode in (CHECKED, DOUBT) else [None]:
                own = data["meta"].get("doubt_threshold") if mode == DOUBT else None  # the model profile's
                rows = rescore(data["rows"], mode, texts, questions, own if threshold is None else threshold)
                shown = "default" if threshold is None and mode in (CHECKED, DOUBT) else threshold or "-"
                for method, budget in cells:
                    f = abstention_figures(rows, method, budget)
                    lost = abstention_figures(given, method, budget).right - f.right
                    lines.append(
                        f"| {path.stem} | {mode} | {shown} | {method} | {budget or '-'} "
                        f"| {_pct(f.right, f.answerable)} | {_pct(f.abstained, f.unanswerable)} "
                        f"| {_pct(f.located, f.right)} | {lost} |"
                        + (f" {versus_cell(rows, base, method, budget)} |" if versus else "")
                    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="real-suite run files (documents read whole)")
    parser.add_argument("--modes", default=",".join(ABSTAIN_MODES), help="comma-separated --abstain modes")
    parser.add_argument("--thresholds", default="", help="comma-separated thresholds for checked and doubt")
    parser.add_argument("--versus", default="", help="a mode every row is compared with, paired by question")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in [*modes, *([args.versus] if args.versus else [])] if m not in ABSTAIN_MODES]
    if bad:
        sys.exit(f"error: unknown --abstain mode {', '.join(bad)} — choose from {', '.join(ABSTAIN_MODES)}")
    print(f"$ python scripts/real_abstention.py {' '.join(sys.argv[1:])}\n")
    try:
        thresholds = [float(t) for t in args.thresholds.split(",") if t.strip()]
    except ValueError:
        sys.exit(f"error: --thresholds {args.thresholds!r} is not a comma-separated list of numbers")
    print(table(args.runs, modes, thresholds, args.versus))


if __name__ == "__main__":
    main()
