"""The genre suite's report: summaries of the tune and held-out genres apart, the paired bootstrap
interval of every CAKE-vs-baseline difference (`bench.bootstrap`), the claims those intervals
allow, and (with `--diagnose survival`) how many of the facts' tokens each method kept.

A claim "CAKE >= baseline" is printed as SUPPORTED only where the 95% interval's lower bound is
>= 0; otherwise it reads NOT SHOWN (the difference may still be positive, but these cases do not
establish it).
"""

from __future__ import annotations

from cake_cli.bench.bootstrap import claim, paired_intervals
from cake_cli.bench.genres import GENRE_SPLITS
from cake_cli.bench.quality.report import Summary, summarize
from cake_cli.bench.scoring import GENRE_WEIGHTS
from cake_cli.bench.survival import survival_by_layer, survival_summary


def split_rows(rows: list[dict]) -> dict[str, list[dict]]:
    """{"tune": rows, "held-out": rows} by each row's genre split (`split` field); empty splits left out."""
    out = {s: [r for r in rows if r.get("split") == s] for s in GENRE_SPLITS}
    return {s: v for s, v in out.items() if v}


def split_summaries(rows, methods, budgets, metric: str = "score") -> dict[str, Summary]:
    """{split: Summary} of each genre split (tasks weighted by `scoring.GENRE_WEIGHTS`)."""
    parts = split_rows(rows)
    return {s: summarize(part, methods, budgets, metric=metric, weights=GENRE_WEIGHTS) for s, part in parts.items()}


def interval_rows(rows, methods, budgets, versus: str = "cake", metric: str = "score", **kwargs) -> list[list[str]]:
    """Rows [split, baseline, "mean [low, high]" of versus - baseline (x 100) at each budget], every
    split and all genres together; a difference whose lower bound is >= 0 is marked with "*"."""
    out = []
    parts = {**split_rows(rows), "all genres": rows}
    for split, part in parts.items():
        intervals = paired_intervals(part, versus, methods, budgets, metric, **kwargs)
        for m in methods:
            if m == versus or not any((m, b) in intervals for b in budgets):
                continue
            cells = []
            for b in budgets:
                iv = intervals.get((m, b))
                cells.append(
                    "-"
                    if iv is None
                    else f"{100 * iv.mean:+.1f} [{100 * iv.low:+.1f}, {100 * iv.high:+.1f}]{'*' if claim(iv) else ''}"
                )
            out.append([split, m, *cells])
    return out


def claim_lines(rows, methods, budgets, versus: str = "cake", metric: str = "score", **kwargs) -> list[str]:
    """SUPPORTED / NOT SHOWN lines: on the held-out genres, `versus` >= each evicting baseline at
    each budget by the paired interval's lower bound."""
    held = split_rows(rows).get("held-out", [])
    intervals = paired_intervals(held, versus, methods, budgets, metric, **kwargs)
    lines = []
    for b in budgets:
        for m in methods:
            iv = intervals.get((m, b))
            if m in (versus, "full") or iv is None:
                continue
            verdict = "SUPPORTED" if claim(iv) else "NOT SHOWN"
            lines.append(
                f"{verdict} B={b} held-out genres: {versus} >= {m} ({metric}; mean difference {100 * iv.mean:+.1f}, "
                f"95% paired bootstrap [{100 * iv.low:+.1f}, {100 * iv.high:+.1f}], {iv.cases} cases)"
            )
    return lines


MULTI_FACT_TASKS = ("m-rt", "m-each", "m-rs")
MULTI_FACT_TARGET = (256, 16384, 0.90)  # issue 23: at B, on prompts of this length, this share of full's exact


def multi_fact_check(rows: list[dict], versus: str = "cake", target=MULTI_FACT_TARGET) -> list[str]:
    """PASS / FAIL: on the held-out genres' multi-fact tasks at (budget, length), `versus`'s exact-answer
    accuracy is at least the target share of the full cache's; [] when those rows are absent."""
    budget, length, share = target
    held = [r for r in split_rows(rows).get("held-out", []) if r["task"] in MULTI_FACT_TASKS and r["length"] == length]
    mine = [r["exact"] for r in held if r["method"] == versus and r["budget"] == budget and r.get("exact") is not None]
    full = [r["exact"] for r in held if r["method"] == "full" and r.get("exact") is not None]
    if not mine or not full:
        return []
    a, f = sum(mine) / len(mine), sum(full) / len(full)
    ratio = a / f if f > 0 else 1.0
    return [
        f"{'PASS' if ratio >= share else 'FAIL'} B={budget} at {length} tokens, held-out multi-fact tasks: {versus} "
        f"{100 * a:.1f}% vs full {100 * f:.1f}% exact ({ratio:.0%} of full; target {share:.0%}; {len(mine)} cases)"
    ]


def survival_rows(rows: list[dict], methods, budgets) -> list[list[str]]:
    """Rows [method, "mean% / whole%" at each budget]: the mean share of the facts' tokens kept over
    layers (and heads), and the share of facts kept whole in every layer (`survival.survival_summary`)."""
    table = survival_summary(rows)
    out = []
    for m in methods:
        if not any((m, b) in table for b in budgets):
            continue
        cells = (_kept(table[(m, b)]) if (m, b) in table else "-" for b in budgets)
        out.append([m, *cells])
    return out


def survival_layer_rows(rows: list[dict], methods, budget: int) -> list[list[str]]:
    """Rows [layer, mean % of the facts' tokens each method kept there] at one budget: where a
    method loses a fact (every layer: too small budgets; some layers with room: its indicator)."""
    columns = [(m, survival_by_layer(rows, m, budget)) for m in methods]
    columns = [(m, c) for m, c in columns if c]
    if not columns:
        return []
    layers = max(len(c) for _, c in columns)
    return [[str(i), *(f"{100 * c[i]:.0f}" if i < len(c) else "-" for _, c in columns)] for i in range(layers)]


def survival_methods(rows: list[dict], methods, budget: int) -> list[str]:
    """The methods with survival rows at `budget` (the columns of `survival_layer_rows`)."""
    return [m for m in methods if survival_by_layer(rows, m, budget)]


def _kept(pair: tuple[float, float]) -> str:
    return f"{100 * pair[0]:.0f} / {100 * pair[1]:.0f}"


def markdown_table(head: list[str], body: list[list[str]]) -> str:
    """A GitHub markdown table (first column left-aligned, the others right-aligned)."""
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])
