"""The layer inspector: prefill only, and report how CAKE scores and budgets every layer.

No generation: the prompt (the one `cake summarize` would build for the document) runs through
the model once with the CAKE cascade, and the per-layer dispersion H_l, shift V_l, preference
share P_l / sum P, budget B_l and tokens kept are returned (docs/method.md §Layer preference, §Budget allocation). No
typer or rich here.
"""

from __future__ import annotations

from cake_cli.tasks.request import Callbacks, Plan
from cake_cli.tasks.results import InspectResult
from cake_cli.tasks.runner import ReadyModel, prepare, run_engine, run_summary


def inspect_layers(plan: Plan, callbacks: Callbacks | None = None, model: ReadyModel | None = None) -> InspectResult:
    """Prefill the plan's document with CAKE and return the per-layer statistics and budgets.

    Args:
        plan: a checked request (`planning.plan`); `plan.request.task` names the template whose
            prompt is prefilled.
        callbacks: status, per-layer progress and warnings.

    Returns:
        InspectResult; when the prompt is longer than the budget the budgets B_l sum to
        (B - w) · L_global minus at most L (L_global: the layers not sliding-window; integer rounding, docs/method.md
        §Budget allocation).

    Raises:
        CakeError: bad document, model or options (one line with a hint).
    """
    cb = callbacks or Callbacks()
    prep = prepare(plan, cb, model)
    result = run_engine(prep, cb, max_new_tokens=0)
    return InspectResult(
        **run_summary(prep, result),
        document=plan.doc.source,
        template=plan.request.task,
        evictable_total=prep.config.evictable_total(sum(row.window is None for row in result.layers))
        if prep.config
        else None,  # local layers (native sliding window) share no budget
        warnings=tuple(prep.warnings),
    )
