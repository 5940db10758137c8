"""`cake inspect-layers` after its options were checked: prefill only and show the layer table;
the heavy half of `cli.commands.inspect_layers`."""

from __future__ import annotations

import json
import sys

from cake_cli.cli.options import PrefillOptions
from cake_cli.cli.progress import StderrProgress, console
from cake_cli.cli.report import render_inspect
from cake_cli.tasks.layers import inspect_layers
from cake_cli.tasks.request import Callbacks, Plan


def inspect_and_show(plan: Plan, opts: PrefillOptions, progress: StderrProgress) -> None:
    """Prefill only and show the layer table on stdout (or one JSON object)."""
    result = inspect_layers(
        plan, Callbacks(on_status=progress.status, on_layer=progress.layer, on_warning=progress.warning)
    )
    if opts.json_out:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
    else:
        render_inspect(result, console(stderr=False))
