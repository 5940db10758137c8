"""`cake inspect-layers`: prefill only, and show how CAKE scores and budgets every layer."""

from __future__ import annotations

from cake_cli.cli import options as o
from cake_cli.cli.app import app, handled
from cake_cli.cli.commands.tasks import checked_plan, task_request
from cake_cli.cli.options import PrefillOptions, with_options
from cake_cli.cli.progress import StderrProgress
from cake_cli.errors import UsageError
from cake_cli.tasks.request import INSPECT_TEMPLATE, sample_document
from cake_cli.tasks.saved.fileformat import is_cache_path
from cake_cli.tasks.saved.request import check_global


@app.command("inspect-layers")
@with_options(PrefillOptions)
def inspect_layers(document: o.InspectDocument = None, *, opts: PrefillOptions) -> None:
    """Prefill a document (the prompt `cake summarize` would build; no generation) and show, per layer,
    dispersion H, shift V, preference share P, budget B_l at --budget and tokens kept. The table (or
    --json) goes to stdout, progress to stderr."""
    with handled():
        if document is not None and is_cache_path(document):
            raise UsageError(
                f"inspect-layers prefills a document; {document} is already compressed",
                "give the document itself (a task on the .cake shows its per-layer budgets)",
            )
        request = task_request(INSPECT_TEMPLATE, document or str(sample_document()), {}, opts)
        progress = StderrProgress(opts.quiet)
        checked = checked_plan(request, progress)
        check_global(checked)
        from cake_cli.cli.runners import inspect_layers as run  # noqa: PLC0415 - torch loads after the checks

        run.inspect_and_show(checked, opts, progress)
