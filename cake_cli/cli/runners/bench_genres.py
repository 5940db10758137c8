"""The genre suite's half of the benchmark runners: `cake bench quality --suite genres` (the tune
and held-out genres' tables, the paired bootstrap intervals and the claims they allow), the
--diagnose survival tables of every suite, and the profile search's tables (`cake bench tau-search
--suite genres`)."""

from __future__ import annotations

import importlib.util
import json
import sys

from rich.markup import escape
from rich.table import Table

from cake_cli.bench.genres import GENRE_SPLITS
from cake_cli.bench.quality import genre_report
from cake_cli.bench.quality.plot import plot as draw
from cake_cli.bench.quality.report import fmt_score, summarize, target_checks
from cake_cli.bench.quality.tables import markdown as to_markdown
from cake_cli.bench.quality.tables import rich_tables
from cake_cli.bench.scoring import GENRE_WEIGHTS
from cake_cli.cli.bench_options import GridSetup, SearchGrid
from cake_cli.cli.progress import console
from cake_cli.files import write_atomic


def reference_scores(rows: list[dict], budgets: list[int], search: SearchGrid) -> list[tuple]:
    """[(method, budget, chosen-on score, other genres' score)] of the full cache and SnapKV rows
    of a profile search (weighted like the grid, `scoring.GENRE_WEIGHTS`)."""
    on = set(GENRE_SPLITS[search.choose_on])
    out = []
    for method in ("full", "snapkv"):
        for b in budgets:
            picked = [r for r in rows if r["method"] == method and r["budget"] in (b, None)]
            scores = []
            for side in (True, False):
                part = [r for r in picked if (r.get("genre") in on) == side]
                summ = summarize(part, [method], [b], weights=GENRE_WEIGHTS) if part else None
                scores.append(summ.get("overall", method, b) if summ else None)
            out.append((method, b, *scores))
    return out


def profile_table(c, choose_on: str) -> Table:
    """The best taus of each (pooling, kernel, gamma) at one budget: its score on the genres chosen
    on and on the others (x 100), the chosen setting in bold."""
    best: dict = {}
    for point, (mine, other) in c.points.items():
        setting = point[2:]
        if setting not in best or mine > best[setting][1]:
            best[setting] = (point[:2], mine, other)
    table = Table(title=f"B = {c.budget}: best taus per indicator setting")
    for head in ("pooling", "gamma", "taus", f"{choose_on} genres", "other genres"):
        table.add_column(head, justify="left" if head in ("pooling", "taus") else "right")
    for (kind, kernel, gamma), (taus, mine, other) in sorted(best.items(), key=lambda kv: -kv[1][1]):
        bold = "[bold]" if (kind, kernel, gamma) == c.indicator else ""
        table.add_row(
            f"{bold}{kind}{kernel}", f"{gamma:g}", f"{taus[0]:g}, {taus[1]:g}", fmt_score(mine), fmt_score(other)
        )
    return table


def genres_report(setup: GridSetup, loaded, meta: dict, rows: list[dict], plot, markdown) -> None:
    """`cake bench quality --suite genres`: tables of the tune and held-out genres, the paired
    bootstrap intervals of CAKE's differences, the claims they allow, and fact survival."""
    names, budgets = [v.name for v in setup.variants], list(setup.configs)
    title = f"cake bench quality · {loaded.name}"
    summaries = {metric: genre_report.split_summaries(rows, names, budgets, metric) for metric in ("score", "exact")}
    all_genres = summarize(rows, names, budgets, weights=GENRE_WEIGHTS)
    intervals = genre_report.interval_rows(rows, names, budgets)
    claims = genre_report.claim_lines(rows, names, budgets) + genre_report.claim_lines(
        rows, names, budgets, metric="exact"
    )
    survival = genre_report.survival_rows(rows, names, budgets)
    checks = target_checks(summaries["score"]["held-out"], targets=()) if "held-out" in summaries["score"] else []
    checks = [f"{c} (held-out genres)" for c in checks] + genre_report.multi_fact_check(rows)
    png = plot or (setup.output.with_suffix(".png") if setup.output else None)
    if png and importlib.util.find_spec("matplotlib") is not None:
        draw(all_genres, png, f"{title} · all genres, {len(rows)} answers")
    iv_head = ["genres", "cake vs", *(f"B={b}" for b in budgets)]
    if markdown:
        parts = [
            f"**{split} genres**\n\n" + to_markdown(summ)
            for metric in summaries.values()
            for split, summ in metric.items()
        ]
        parts.append("**cake - baseline, mean [95% paired bootstrap] x 100 (* lower bound >= 0)**\n\n")
        parts[-1] += genre_report.markdown_table(iv_head, intervals)
        if survival:
            head = ["method", *(f"B={b}" for b in budgets)]
            parts.append("**fact tokens kept: mean % over layers / % of facts kept whole**\n\n")
            parts[-1] += genre_report.markdown_table(head, survival)
            low = min(budgets)
            layer_head = ["layer", *genre_report.survival_methods(rows, names, low)]
            parts.append(f"**fact tokens kept per layer at B={low}, %**\n\n")
            parts[-1] += genre_report.markdown_table(layer_head, genre_report.survival_layer_rows(rows, names, low))
        write_atomic(markdown, "\n\n".join(parts) + "\n\n" + "\n".join(claims) + "\n", "markdown file")
    if setup.json_out:
        payload = {
            "meta": meta,
            "splits": {m: {s: v.to_json() for s, v in d.items()} for m, d in summaries.items()},
            "intervals": [dict(zip(iv_head, r)) for r in intervals],
            "claims": claims,
            "survival": [dict(zip(["method", *map(str, budgets)], r)) for r in survival],
            "checks": checks,
        }
        sys.stdout.write(json.dumps(payload, indent=1) + "\n")
        return
    out = console(stderr=False)
    for metric in summaries.values():
        for split, summ in metric.items():
            for heading, table in rich_tables(summ, f"{title} · {split} genres"):
                out.print(f"[bold]{escape(heading)}[/]")
                out.print(table)
    table = Table()
    for i, h in enumerate(iv_head):
        table.add_column(h, justify="left" if i < 2 else "right")
    for r in intervals:
        table.add_row(*r)
    out.print(f"[bold]{escape(title)} · cake - baseline, mean [95% paired bootstrap] x 100 (* lower bound >= 0)[/]")
    out.print(table)
    print_survival(out, rows, names, budgets, title)
    for line in claims + checks:
        out.print(line)


def print_survival(out, rows: list[dict], names: list[str], budgets: list[int], title: str) -> None:
    """The --diagnose survival tables (when the rows carry it): per budget, the share of the facts'
    tokens each method kept, and at the smallest budget, per layer."""
    if not any(r.get("survival") for r in rows):
        return
    low = min(budgets)
    methods = genre_report.survival_methods(rows, names, low)
    for heading, head, body in (
        (
            "fact tokens kept: mean % over layers / % of facts kept whole in every layer",
            ["method", *(f"B={b}" for b in budgets)],
            genre_report.survival_rows(rows, names, budgets),
        ),
        (
            f"fact tokens kept per layer at B={low}, %",
            ["layer", *methods],
            genre_report.survival_layer_rows(rows, names, low),
        ),
    ):
        table = Table()
        for i, h in enumerate(head):
            table.add_column(h, justify="left" if i == 0 else "right")
        for r in body:
            table.add_row(*r)
        out.print(f"[bold]{escape(title)} · {heading}[/]")
        out.print(table)
