"""The abstention figures of real-suite runs, each rescored under every `--abstain` mode.

Each run file (`cake bench quality --suite real -o RUN.json`, any `--abstain`) is read, its
stored replies read and scored again as this code with each `--abstain` mode reads them
(`bench.quality.abstention.rescore`: nothing is decoded again), and one markdown row printed per
run x mode x method x budget: exact accuracy on the answerable questions, right abstentions on
the unanswerable ones, the share of right answers with a located passage and the right answers
(of `never`) the rule withholds. The command line is printed first, so the output can be kept as
a run file.

    python scripts/real_abstention.py benchmarks/runs/abstain-base-tune.json [...] [--modes never,unsupported]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cake_cli.bench.quality.abstention import abstention_figures, rescore, rescore_inputs
from cake_cli.tasks.answers.abstain import ABSTAIN_MODES, NEVER

HEADER = (
    "| run | --abstain | method | B | exact, answerable | right abstentions | right answers located "
    "| right answers lost to abstention |\n|---|---|---|---:|---:|---:|---:|---:|"
)


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}% ({part}/{whole})" if whole else "n/a"


def table(runs: list[Path], modes: list[str]) -> str:
    """The markdown table of every run x mode x method x budget (see the module docstring)."""
    loaded = [(path, json.loads(path.read_text())) for path in runs]
    texts, questions = rescore_inputs([r for _, data in loaded for r in data["rows"]])
    lines = [HEADER]
    for path, data in loaded:
        cells = sorted({(r["method"], r["budget"]) for r in data["rows"]}, key=lambda c: (c[1] is not None, c))
        given = rescore(data["rows"], NEVER, texts, questions)
        for mode in modes:
            rows = rescore(data["rows"], mode, texts, questions)
            for method, budget in cells:
                f = abstention_figures(rows, method, budget)
                lost = abstention_figures(given, method, budget).right - f.right
                lines.append(
                    f"| {path.stem} | {mode} | {method} | {budget or '-'} | {_pct(f.right, f.answerable)} "
                    f"| {_pct(f.abstained, f.unanswerable)} | {_pct(f.located, f.right)} "
                    f"| {lost} |"
                )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="real-suite run files (documents read whole)")
    parser.add_argument("--modes", default=",".join(ABSTAIN_MODES), help="comma-separated --abstain modes")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in ABSTAIN_MODES]
    if bad:
        sys.exit(f"error: unknown --abstain mode {', '.join(bad)} — choose from {', '.join(ABSTAIN_MODES)}")
    print(f"$ python scripts/real_abstention.py {' '.join(sys.argv[1:])}\n")
    print(table(args.runs, modes))


if __name__ == "__main__":
    main()
