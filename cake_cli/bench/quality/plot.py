"""The quality benchmark's picture: score vs budget, one panel per task (matplotlib, optional)."""

from __future__ import annotations

from pathlib import Path

from cake_cli.bench.figures import pyplot, save_png
from cake_cli.bench.quality.report import TASK_TITLES, Summary


def plot(summary: Summary, path: Path, title: str) -> None:
    """PNG: score vs budget (log2 axis), one line per method, one panel per task + overall (all
    lengths) + overall at the longest length; full cache as a dashed line. matplotlib, Agg backend.

    Raises:
        CakeError: matplotlib is not installed (with the install command).
    """
    plt = pyplot()
    panels = [(t, None) for t in summary.tasks]
    if len(summary.lengths) > 1:
        panels.append(("overall", summary.lengths[-1]))  # the longest contexts on their own
    cols = min(3, len(panels))
    rows_n = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(5 * cols, 3.6 * rows_n), squeeze=False)
    budgets = list(summary.budgets)
    for ax, (task, length) in zip(axes.flat, panels):
        for m in summary.methods:
            ys = [summary.get(task, m, b, length) for b in budgets]
            if all(y is None for y in ys):
                continue
            ys = [float("nan") if y is None else 100 * y for y in ys]
            if m == "full":
                ax.plot(budgets, ys, "k--", label="full cache", linewidth=1.2)
            else:
                ax.plot(
                    budgets,
                    ys,
                    marker="o",
                    markersize=3,
                    label=m,
                    linewidth=2.2 if m == "cake" else 1.2,
                    linestyle=":" if "+" in m else "-",
                )
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.set_title(
            TASK_TITLES.get(task, task) + ("" if length is None else f", {length}-token contexts"), fontsize=10
        )
        ax.set_ylim(bottom=0)
        ax.set_xlabel("KV budget B (tokens per layer)")
        ax.set_ylabel("score")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5), fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    save_png(plt, fig, path, "plot", dpi=110)
