"""`--methods NAME@select[:L]` in `cake bench quality --suite real`: a method run on the prompt that
`cake qa --prefill select [--select-layer L]` reads (`engine.selection`, GemFilter's early-layer selection).

Per question, the selection layer's attention from the prompt's last tokens ranks the document tokens
once per layer asked (`selection.selection_scores`, after the document's shared prefix when the suite holds one: the
cut-off forward then runs over the question's tokens only, with the same scores). At each budget B the
best `SELECT_FACTOR` · B document tokens are kept with the sinks and everything from the question on
(`selection.top_tokens`, as `tasks.runner.select_prompt` keeps them), the kept tokens are recorded as a
new, shorter prompt at positions 0..m-1, and the method replays its eviction on that recording and
decodes. A selection that keeps every token is the prompt itself, so its cells replay the question's own
recording (the answers of NAME, decoded once).

A cell's time is what a user waits for with `--prefill select` before the decode: the selection (its
share of the cut-off forward) and the selected prompt's prefill, plus the replay and the decode.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from cake_cli.bench.quality.run import Model, recording_accumulates, replay_cells
from cake_cli.engine.replay import Recording, record
from cake_cli.engine.selection import DEFAULT_QUERIES, default_layer, selection_scores, top_tokens
from cake_cli.tasks.request import SELECT_FACTOR


def replay_selected(
    model: Model,
    ids: torch.Tensor,
    protect_from: int,
    cells: list,
    configs: dict,
    new_tokens: int,
    label: str,
    *,
    window: int,
    prefix=None,
    whole: Recording | None = None,
    on_step: Callable[[str], None] | None = None,
) -> list[tuple]:
    """Every `NAME@select` cell of one prompt, answered on its selected prompt.

    Args:
        ids: [1, n] the prompt; `protect_from`: its first token after the document block (the prompt's
            `prefix_tokens`: instruction, question and chat closing are always kept).
        cells: (variant, budget) pairs of `select` variants, every budget an int.
        configs: budget -> CakeConfig; new_tokens: most tokens an answer may have.
        window: the observation window w the recordings keep.
        prefix: optional full cache of the prompt's shared first tokens (`engine.replay.prefix_cache`).
        whole: the prompt's own recording when the suite made one (with H2O's accumulated attention
            whenever a cell's indicator reads it; reused when a selection keeps every token); made here
            if needed.

    Returns:
        [(variant, budget, config, answer, seconds, prefill seconds)] in cell order: seconds as
        `run.replay_cells` gives them plus the selection's; prefill seconds: the selected prompt's
        recording (the whole prompt's when nothing was dropped).

    Raises:
        ValueError: a cell without a budget, or a selection layer past the model's (`selection_scores`).
    """
    if any(budget is None for _, budget in cells):
        raise ValueError("a selected prompt is cut to a multiple of the budget: every @select cell needs one")
    num_layers = model.model.config.num_hidden_layers
    layer_of = {v.name: default_layer(num_layers) if v.select_layer is None else v.select_layer for v, _ in cells}
    scores, selecting = {}, {}  # layer -> [n] scores, seconds of its cut-off forward
    for layer in sorted(set(layer_of.values())):
        if on_step:
            on_step(f"{label}: selection at layer {layer}")
        start = time.perf_counter()
        scores[layer] = selection_scores(model.model, ids, layer, DEFAULT_QUERIES, prefix)
        selecting[layer] = time.perf_counter() - start
    accumulate = recording_accumulates([variant for variant, _ in cells])
    out: dict = {}
    for layer, budget in sorted({(layer_of[v.name], b) for v, b in cells}):
        kept = top_tokens(scores[layer], protect_from, SELECT_FACTOR * budget)
        group = [(v, b) for v, b in cells if b == budget and layer_of[v.name] == layer]
        if len(kept) == ids.shape[1]:  # nothing dropped: the prompt itself
            chosen = ids
            if on_step:
                on_step(f"{label}: every token selected, the prompt's own prefill")
            if whole is None:
                whole = record(model.model, ids, window, accumulate=accumulate, prefix=None if accumulate else prefix)
            rec = whole
        else:
            chosen = ids[:, list(kept)]  # [1, m], positions re-indexed 0..m-1 by the recording
            if on_step:
                on_step(f"{label}: prefill {chosen.shape[1]} selected tokens")
            rec = record(model.model, chosen, window, accumulate=accumulate)
        for variant, b, config, text, spent, *_ in replay_cells(model, chosen, rec, group, configs, new_tokens, label,
                                                                on_step):  # fmt: skip
            out[(variant.name, b)] = (variant, b, config, text, spent + selecting[layer], rec.seconds)
    return [out[(variant.name, budget)] for variant, budget in cells]
