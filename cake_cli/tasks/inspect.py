"""The layer inspector: prefill only, and report how CAKE scores and budgets every layer.

No generation: the prompt (the one `cake summarize` would build for the document) runs through
the model once with the CAKE cascade, and the per-layer dispersion H_l, shift V_l, preference
share P_l / sum P, budget B_l and tokens kept are returned (spec §1-§2). No typer or rich here.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from cake_cli.tasks.results import InspectResult, layer_results
from cake_cli.tasks.runner import Callbacks, TaskRequest, prepare

INSPECT_TEMPLATE = "summarize"  # whose prompt is prefilled: the window holds its instruction
SAMPLE_NAME = "gull-rock.txt"  # packaged sample document (an original short story, ~1,600 tokens)


def sample_document() -> Path:
    """The packaged sample text used when `cake inspect-layers` gets no document."""
    return Path(str(resources.files("cake_cli.tasks") / "data" / "samples" / SAMPLE_NAME))


def inspect_layers(request: TaskRequest, callbacks: Callbacks | None = None) -> InspectResult:
    """Prefill `request.document` with CAKE and return the per-layer statistics and budgets.

    Args:
        request: as for a task (model, budget, window, dtype, attention, device map,
            truncation); `request.task` names the template whose prompt is prefilled.
        callbacks: status, per-layer progress and warnings.

    Returns:
        InspectResult; when the prompt is longer than the budget the budgets B_l sum to
        (B - w) · L minus at most L (integer rounding, spec §2).

    Raises:
        CakeError: bad document, model or options (one line with a hint).
    """
    import torch

    from cake_cli.engine.generate import prefill

    cb = callbacks or Callbacks()
    prep = prepare(request, cb)
    loaded, config = prep.loaded, prep.config
    num_layers = loaded.model.config.num_hidden_layers
    input_ids = torch.tensor([prep.prompt.input_ids], device=loaded.device)  # [1, n]
    if cb.on_status:
        cb.on_status(f"prefill: {input_ids.shape[1]} tokens through {num_layers} layers (no generation)")
    state = prefill(loaded.model, input_ids, config, on_layer=cb.on_layer)
    rows = state.rows()
    return InspectResult(
        document=prep.doc.source,
        template=request.task,
        model=loaded.name,
        device=str(loaded.device),
        dtype=str(loaded.dtype).replace("torch.", ""),
        attention=prep.backend,
        prompt_tokens=input_ids.shape[1],
        document_tokens=prep.prompt.document_tokens,
        original_document_tokens=prep.prompt.original_document_tokens,
        budget=config.budget,
        window=config.window,
        tau1=config.tau1,
        tau2=config.tau2,
        tau_rule=prep.tau_rule,
        gamma=config.gamma,
        evicted=any(row.budget is not None for row in rows),
        evictable_total=config.evictable_total(num_layers),
        layers=layer_results(rows),
        kv_bytes_full=state.cache.full_bytes,
        kv_bytes_kept=state.kv_bytes,
        kv_peak_prefill=state.peak_bytes,
        load_seconds=loaded.load_seconds,
        prefill_seconds=state.seconds,
        eviction_seconds=state.cascade.seconds if state.cascade else 0.0,
        warnings=tuple(prep.warnings),
    )
