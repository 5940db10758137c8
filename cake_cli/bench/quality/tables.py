"""The quality benchmark's tables: score (or exact-answer accuracy) grids per task and length, and
CAKE's paired wins / ties / losses, as rich tables and as markdown from one source."""

from __future__ import annotations

from rich.table import Table

from cake_cli.bench.quality.report import (
    INTERVALS_HEADING,
    TASK_TITLES,
    RealInterval,
    Summary,
    fmt_score,
    interval_grid,
)

UNITS = {"score": "score x 100", "exact": "exact-answer accuracy %"}


_PAIRED_HEADING = "{} vs each method on the same cases: wins-ties-losses"


def grid(summary: Summary, task: str, length: int | None = None) -> list[list[str]]:
    """Rows [method, score at each budget] of one task (x 100, one decimal)."""
    return [[m, *(fmt_score(summary.get(task, m, b, length)) for b in summary.budgets)] for m in summary.methods]


def _title(task: str, length: int | None) -> str:
    where = "all lengths" if length is None else f"{length}-token contexts"
    return f"{TASK_TITLES.get(task, task)}, {where}"


def _views(summary: Summary, views: list) -> list[tuple[str, str, str, list[list[str]]]]:
    """[(heading, unit, first column, rows)]: the score grid of each (task, length) in `views`, then
    the paired wins-ties-losses grid when there is one. One source for the rich and markdown tables."""
    unit = f" · {UNITS.get(summary.metric, summary.metric)}"
    out = [(_title(task, length), unit, "method", grid(summary, task, length)) for task, length in views]
    if summary.paired:
        out.append((_PAIRED_HEADING.format(summary.versus), unit, f"{summary.versus} vs", summary.paired_grid()))
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


def intervals_markdown(intervals: list[RealInterval], budgets, title: str) -> str:
    """The real suite's paired intervals (`report.interval_grid`) as one GitHub markdown table."""
    heading = INTERVALS_HEADING.format(versus=intervals[0].versus)
    head = "| vs | questions | " + " | ".join(f"B={b}" for b in budgets) + " |"
    rule = "|---|---|" + "---:|" * len(budgets)
    body = ["| " + " | ".join(row) + " |" for row in interval_grid(intervals, budgets)]
    return f"**{title} · {heading}**\n\n" + "\n".join([head, rule, *body]) + "\n"


def markdown(summary: Summary) -> str:
    """The views of `rich_tables` plus each task at the longest length, as GitHub markdown tables
    (headed with their unit: score x 100 or exact-answer accuracy %; the paired counts last)."""
    views = [(t, None) for t in summary.tasks] + [("overall", n) for n in summary.lengths]
    if summary.lengths:
        views += [(t, summary.lengths[-1]) for t in summary.tasks if t != "overall"]
    parts = []
    for heading, unit, first, rows in _views(summary, views):
        head = f"| {first} | " + " | ".join(f"B={b}" for b in summary.budgets) + " |"
        rule = "|---|" + "---:|" * len(summary.budgets)
        body = ["| " + " | ".join(row) + " |" for row in rows]
        parts.append(f"**{heading}{unit}**\n\n" + "\n".join([head, rule, *body]))
    return "\n\n".join(parts) + "\n"
