"""`cake inspect-layers`: prefill only, and show how CAKE scores and budgets every layer."""

from __future__ import annotations

import json
import sys

from cake_cli.cli import options as o
from cake_cli.cli.app import StderrProgress, app, handled

INSPECT_BUDGET = 256  # default B here: the packaged sample is ~1,700 prompt tokens


@app.command("inspect-layers")
def inspect_layers(
    document: o.InspectDocument = None,
    model: o.Model = None,
    budget: o.Budget = INSPECT_BUDGET,
    window: o.Window = None,
    dtype: o.Dtype = "auto",
    attention: o.Attention = "auto",
    device_map: o.DeviceMap = None,
    truncate: o.Truncate = "middle",
    password: o.Password = None,
    json_out: o.Json = False,
    quiet: o.Quiet = False,
) -> None:
    """Prefill a document (the prompt `cake summarize` would build; no generation) and show, per layer,
    dispersion H, shift V, preference share P, budget B_l at --budget and tokens kept. The table (or
    --json) goes to stdout, progress to stderr."""
    from rich.console import Console

    from cake_cli.cli.report import render_inspect
    from cake_cli.tasks.inspect import INSPECT_TEMPLATE, sample_document
    from cake_cli.tasks.inspect import inspect_layers as run_inspect
    from cake_cli.tasks.runner import Callbacks, TaskRequest

    with handled():
        progress = StderrProgress(quiet or json_out)
        request = TaskRequest(
            task=INSPECT_TEMPLATE,
            document=document or str(sample_document()),
            model=model,
            budget=budget,
            window=window,
            dtype=dtype,
            attention=attention,
            device_map=device_map,
            truncate=truncate,
            password=password,
        )
        result = run_inspect(
            request, Callbacks(on_status=progress.status, on_layer=progress.layer, on_warning=progress.warning)
        )
        if json_out:
            sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
        else:
            render_inspect(result, Console(file=sys.stdout, highlight=False))
