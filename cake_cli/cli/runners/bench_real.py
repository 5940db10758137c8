"""The real suite's `--diagnose survival` report: where each method's lost answers went
(`bench.real_diagnosis`), as rich tables on stdout and as markdown for `--markdown`."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from cake_cli.bench.quality.genre_report import markdown_table
from cake_cli.bench.real_diagnosis import LOSS_HEAD, cause_counts, loss_rows, losses, outcome_rows

LISTED = "cake"  # the method whose every lost answer is listed (the others are counted)


def diagnosis_tables(rows: list[dict], names: list[str], budgets: list[int]) -> list[tuple[str, list, list]]:
    """[(heading, head, body)]: per evicting method, its lost answers by cause and budget, then the
    list of CAKE's lost answers with the per-layer survival drawn; [] when no row carries `kept`."""
    if not any(r.get("kept") for r in rows):
        return []
    out = []
    for name in names:
        if name == "full" or not any(r["method"] == name and r.get("kept") for r in rows):
            continue
        found = losses(rows, name)
        out.append(
            (
                f"{name}: answers the full cache got right and {name} lost, by cause (survival of the gold passage)",
                ["cause", *(f"B={b}" for b in budgets)],
                cause_counts(found, budgets),
            )
        )
        out.append(
            (
                f"{name}: passage % / answer % of their tokens kept (answers), on the questions the full cache got "
                "right, by what it answered",
                [name, *(f"B={b}" for b in budgets)],
                outcome_rows(rows, budgets, name),
            )
        )
        if name == LISTED and found:
            heading = f"{name}: each lost answer, tokens kept per layer (layer 0 first)"
            out.append((heading, LOSS_HEAD, loss_rows(found)))
    return out


def print_real_diagnosis(out, rows: list[dict], names: list[str], budgets: list[int], title: str) -> None:
    """`diagnosis_tables` printed as rich tables."""
    for heading, head, body in diagnosis_tables(rows, names, budgets):
        table = Table()
        for i, h in enumerate(head):
            table.add_column(h, justify="left" if i == 0 or "layer" in h or h == "cause" else "right")
        for r in body:
            table.add_row(*map(escape, r))
        out.print(f"[bold]{escape(title)} · {escape(heading)}[/]")
        out.print(table)


def diagnosis_markdown(rows: list[dict], names: list[str], budgets: list[int]) -> str:
    """`diagnosis_tables` as markdown sections ('' without diagnosed rows)."""
    tables = diagnosis_tables(rows, names, budgets)
    return "\n".join(f"**{heading}**\n\n{markdown_table(head, body)}\n" for heading, head, body in tables)
