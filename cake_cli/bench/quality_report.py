"""Results of `cake bench quality`: the resumable JSON file, averages, tables, markdown and plot.

Averages: a task's score at (method, budget) is the plain mean over its cases and lengths
(each case counts once per length); the overall score is the weighted mean of the task scores
(`scoring.TASK_WEIGHTS`: S-RT 0.3, M-RT 0.225, M-RS 0.225, QA 0.25, i.e. NeedleBench's
0.4/0.3/0.3 for the needle tasks scaled to 3/4, plus 1/4 for QA), renormalised over the tasks
present. "full" (no eviction) has no budget; it is shown at every budget. Scores are reported
x 100.

Paired counts: means over a few cases hide whether one method wins broadly or by a few big
cases, so `summarize` also counts, per budget, the cases (task, case, length) where CAKE scores
above / equal to / below each other method on the same prompt (a sign-test view).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.table import Table

from cake_cli.bench.scoring import TASK_WEIGHTS, weighted_overall
from cake_cli.bench.suites import result_key
from cake_cli.errors import CakeError, UsageError
from cake_cli.files import write_atomic

FORMAT = "cake-bench-quality"
FORMAT_VERSION = 1
META_MUST_MATCH = ("model", "split", "haystack", "window")  # a resumed file must agree on these
TASK_TITLES = {
    "s-rt": "single-needle retrieval (S-RT)",
    "m-rt": "multi-needle retrieval (M-RT)",
    "m-rs": "multi-needle reasoning (M-RS)",
    "qa": "QA, SQuAD + HotpotQA (F1)",
    "overall": "overall",
}


def load_results(path: Path) -> tuple[dict, list[dict]]:
    """(meta, rows) of a results file; ({}, []) when it does not exist.

    Raises:
        CakeError: the file is not a results file of this format.
    """
    if not path.exists():
        return {}, []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT or data.get("version") != FORMAT_VERSION:
            raise ValueError(f"not a {FORMAT} v{FORMAT_VERSION} file")
        return dict(data["meta"]), list(data["rows"])
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as exc:
        raise CakeError(
            f"cannot resume from {path} ({str(exc).splitlines()[0]})",
            "give another --output, or delete the file to start over",
        ) from None


def check_resumable(path: Path, old: dict, new: dict) -> None:
    """Raise UsageError when a results file was made with other settings than this run's."""
    for key in META_MUST_MATCH:
        if old and key in old and old[key] != new.get(key):
            raise UsageError(
                f"{path} was made with {key} = {old[key]!r}, this run has {new.get(key)!r}",
                "give another --output to start a new results file",
            )


def save_results(path: Path, meta: dict, rows: list[dict]) -> None:
    """Write the results file atomically (`files.write_atomic`: temporary file, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": FORMAT, "version": FORMAT_VERSION, "meta": meta, "rows": rows}
    write_atomic(path, json.dumps(payload, indent=1, ensure_ascii=False) + "\n", "results file")


def row_key(row: dict) -> tuple:
    """The resume key of a stored row (see `quality.result_key`)."""
    return result_key(row["task"], row["case_id"], row["length"], row["method"], row["budget"])


@dataclass(frozen=True)
class Summary:
    """Mean scores (fractions) by task ("overall" included), method and budget, over all lengths
    (`length` None) and per length. `cases` counts the rows behind each task cell."""

    methods: tuple[str, ...]
    budgets: tuple[int, ...]
    lengths: tuple[int, ...]
    tasks: tuple[str, ...]  # tasks present, then "overall"
    scores: dict  # (task, method, budget, length | None) -> mean score
    cases: dict  # (task, method, budget, length | None) -> rows averaged
    paired: dict = field(default_factory=dict)  # (other method, budget) -> (wins, ties, losses) of `versus`
    versus: str = "cake"

    def get(self, task: str, method: str, budget: int, length: int | None = None) -> float | None:
        return self.scores.get((task, method, budget, length))

    def to_json(self) -> dict:
        return {
            "methods": list(self.methods),
            "budgets": list(self.budgets),
            "lengths": list(self.lengths),
            "tasks": list(self.tasks),
            "scores": [
                {"task": t, "method": m, "budget": b, "length": n, "score": s, "rows": self.cases.get((t, m, b, n), 0)}
                for (t, m, b, n), s in sorted(self.scores.items(), key=lambda kv: str(kv[0]))
            ],
            "paired": [
                {"method": self.versus, "versus": m, "budget": b, "wins": won, "ties": tied, "losses": lost}
                for (m, b), (won, tied, lost) in self.paired.items()
            ],
        }

    def paired_grid(self) -> list[list[str]]:
        """Rows [other method, "wins-ties-losses" of `versus` at each budget]."""
        others = [m for m in self.methods if any((m, b) in self.paired for b in self.budgets)]
        return [
            [m, *("-".join(map(str, self.paired[(m, b)])) if (m, b) in self.paired else "-" for b in self.budgets)]
            for m in others
        ]


def paired_counts(rows: list[dict], versus: str, methods: list[str], budgets: list[int], tol: float = 1e-9) -> dict:
    """{(other method, budget): (wins, ties, losses)} of `versus` over the cases (task, case_id,
    length) that both methods answered at that budget; "full" is compared at every budget. Scores
    within `tol` tie."""
    by_key = {row_key(r): r["score"] for r in rows}
    cases = {(r["task"], r["case_id"], r["length"]) for r in rows}
    out = {}
    for m in methods:
        if m == versus:
            continue
        for b in budgets:
            won = tied = lost = 0
            for c in cases:
                mine = by_key.get(result_key(*c, versus, b))
                other = by_key.get(result_key(*c, m, None if m == "full" else b))
                if mine is None or other is None:
                    continue
                if abs(mine - other) <= tol:
                    tied += 1
                elif mine > other:
                    won += 1
                else:
                    lost += 1
            if won + tied + lost:
                out[(m, b)] = (won, tied, lost)
    return out


def summarize(
    rows: list[dict], methods: list[str] | None = None, budgets: list[int] | None = None, versus: str = "cake"
) -> Summary:
    """Average the rows (see the module docstring); `methods` / `budgets` fix the order shown;
    `versus` is the method whose paired wins / ties / losses against each other method are counted."""
    methods = methods or list(dict.fromkeys(r["method"] for r in rows))
    budgets = budgets or sorted({r["budget"] for r in rows if r["budget"] is not None})
    lengths = sorted({r["length"] for r in rows})
    tasks = [t for t in TASK_WEIGHTS if any(r["task"] == t for r in rows)]
    acc: dict = defaultdict(list)
    for r in rows:
        for b in [r["budget"]] if r["budget"] is not None else budgets:
            for n in (None, r["length"]):
                acc[(r["task"], r["method"], b, n)].append(r["score"])
    scores = {k: sum(v) / len(v) for k, v in acc.items()}
    cases = {k: len(v) for k, v in acc.items()}
    for m in methods:
        for b in budgets:
            for n in (None, *lengths):
                per_task = {t: scores[(t, m, b, n)] for t in tasks if (t, m, b, n) in scores}
                if per_task:
                    scores[("overall", m, b, n)] = weighted_overall(per_task)
                    cases[("overall", m, b, n)] = sum(cases[(t, m, b, n)] for t in per_task)
    paired = paired_counts(rows, versus, methods, budgets) if versus in methods else {}
    return Summary(tuple(methods), tuple(budgets), tuple(lengths), (*tasks, "overall"), scores, cases, paired, versus)


_PAIRED_HEADING = "{} vs each method on the same cases: wins-ties-losses"


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def grid(summary: Summary, task: str, length: int | None = None) -> list[list[str]]:
    """Rows [method, score at each budget] of one task (x 100, one decimal)."""
    return [[m, *(_fmt(summary.get(task, m, b, length)) for b in summary.budgets)] for m in summary.methods]


def _title(task: str, length: int | None) -> str:
    where = "all lengths" if length is None else f"{length}-token contexts"
    return f"{TASK_TITLES.get(task, task)}, {where}"


def _views(summary: Summary, views: list) -> list[tuple[str, str, str, list[list[str]]]]:
    """[(heading, unit, first column, rows)]: the score grid of each (task, length) in `views`, then
    the paired wins-ties-losses grid when there is one. One source for the rich and markdown tables."""
    out = [(_title(task, length), " · score x 100", "method", grid(summary, task, length)) for task, length in views]
    if summary.paired:
        out.append((_PAIRED_HEADING.format(summary.versus), "", f"{summary.versus} vs", summary.paired_grid()))
    return out


def rich_tables(summary: Summary, title: str) -> list:
    """[(heading, rich Table)]: overall and each task over all lengths, then overall per length,
    then CAKE's paired counts."""
    out = []
    views = [(t, None) for t in summary.tasks] + [("overall", n) for n in summary.lengths]
    for heading, unit, first, rows in _views(summary, views):
        table = Table()
        table.add_column(first)
        for b in summary.budgets:
            table.add_column(f"B={b}", justify="right")
        for row in rows:
            table.add_row(*row)
        out.append((f"{title} · {heading}{unit}", table))
    return out


def markdown(summary: Summary) -> str:
    """The views of `rich_tables` plus each task at the longest length, as GitHub markdown tables
    (scores x 100; the paired counts last)."""
    views = [(t, None) for t in summary.tasks] + [("overall", n) for n in summary.lengths]
    if summary.lengths:
        views += [(t, summary.lengths[-1]) for t in summary.tasks if t != "overall"]
    parts = []
    for heading, _unit, first, rows in _views(summary, views):
        head = f"| {first} | " + " | ".join(f"B={b}" for b in summary.budgets) + " |"
        rule = "|---|" + "---:|" * len(summary.budgets)
        body = ["| " + " | ".join(row) + " |" for row in rows]
        parts.append(f"**{heading}**\n\n" + "\n".join([head, rule, *body]))
    return "\n\n".join(parts) + "\n"


def target_checks(
    summary: Summary, method: str = "cake", length: int | None = None, at_budget: int = 256, ratio: float = 0.95
) -> list[str]:
    """Plain-language checks of the targets: `method` >= every other evicting method at every
    budget (overall), and `method` >= ratio x full at `at_budget` on `length` (default: the
    longest length). Each line starts with PASS or FAIL."""
    lines = []
    if method not in summary.methods:
        return lines
    others = [m for m in summary.methods if m not in (method, "full") and "+" not in m]
    for b in summary.budgets:
        mine = summary.get("overall", method, b)
        worse = [
            f"{m} {_fmt(summary.get('overall', m, b))}"
            for m in others
            if mine is not None
            and summary.get("overall", m, b) is not None
            and summary.get("overall", m, b) > mine + 1e-12
        ]
        lines.append(
            f"{'FAIL' if worse else 'PASS'} B={b}: {method} {_fmt(mine)} >= every baseline"
            + (f" (beaten by {', '.join(worse)})" if worse else "")
        )
    length = length if length is not None else (max(summary.lengths) if summary.lengths else None)
    full = summary.get("overall", "full", at_budget, length)
    mine = summary.get("overall", method, at_budget, length)
    if full is not None and mine is not None and at_budget in summary.budgets:
        ok = mine >= ratio * full
        share = f"{100 * mine / full:.0f}%" if full > 0 else "n/a"
        lines.append(
            f"{'PASS' if ok else 'FAIL'} B={at_budget} at {length} tokens: {method} {_fmt(mine)} vs full "
            f"{_fmt(full)} ({share} of full; target {ratio:.0%})"
        )
    return lines


def rows_as_dicts(rows) -> list[dict]:
    """CaseResult objects as plain dicts (the JSON row format)."""
    return [asdict(r) for r in rows]
