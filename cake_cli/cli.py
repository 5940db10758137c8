"""The `cake` command line (Typer). Commands validate options, call one core function and hand
the result to the report; errors are formatted once, here."""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager

import typer
from rich.console import Console

from cake_cli import __version__, options as o
from cake_cli.errors import EXIT_ERROR, EXIT_INTERRUPTED, CakeError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Long-document tasks with a causal LM under a fixed KV-cache budget, using CAKE "
                       "(cascading and adaptive KV cache eviction with layer preferences, ICLR 2025).")


def _stderr() -> Console:
    return Console(stderr=True, highlight=False)


@contextmanager
def handled():
    """Turn known errors into one line on stderr and an exit code (traceback only with CAKE_DEBUG=1)."""
    err = _stderr()
    try:
        yield
    except CakeError as exc:
        if os.environ.get("CAKE_DEBUG") == "1":
            raise
        err.print(f"[bold red]error:[/] {exc.one_line()}", soft_wrap=True)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except (typer.Exit, typer.Abort):
        raise
    except Exception as exc:  # noqa: BLE001 - last line of defence: one line, no traceback
        if os.environ.get("CAKE_DEBUG") == "1":
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        err.print(f"[bold red]internal error:[/] {type(exc).__name__}: {first} — rerun with CAKE_DEBUG=1 for "
                  "the traceback and report it", soft_wrap=True)
        raise typer.Exit(EXIT_ERROR) from None


def resolve_document(document: str | None) -> str:
    """The document argument, or '-' when text is piped in."""
    if document is not None:
        return document
    if not sys.stdin.isatty():
        return "-"
    raise CakeError("no document given", "pass a file path, or '-' to read stdin (e.g. cat notes.txt | cake summarize -)",
                    exit_code=2)


class _Progress:
    """Prefill progress (layer by layer) and status lines on stderr."""

    def __init__(self, quiet: bool):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = _stderr()
        self.quiet = quiet
        self.bar = Progress(TextColumn("prefill"), BarColumn(), MofNCompleteColumn(), TextColumn("layers"),
                            TimeElapsedColumn(), console=self.console, transient=True)
        self.task = None

    def status(self, message: str) -> None:
        if not self.quiet:
            self.console.print(f"[dim]{message}[/]")

    def warning(self, message: str) -> None:
        self.console.print(f"[yellow]warning:[/] {message}", soft_wrap=True)

    def layer(self, index: int, total: int) -> None:
        if self.quiet:
            return
        if self.task is None:
            self.bar.start()
            self.task = self.bar.add_task("prefill", total=total)
        self.bar.update(self.task, completed=index + 1)
        if index + 1 == total:
            self.bar.stop()


def run_and_report(request, as_json: bool, quiet: bool) -> None:
    """Run a task, stream its answer to stdout (or print JSON), and print the report on stderr."""
    from cake_cli.report import render
    from cake_cli.runner import Callbacks, run_task

    progress = _Progress(quiet or as_json)

    def on_text(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    callbacks = Callbacks(on_text=None if as_json else on_text, on_status=progress.status,
                          on_layer=progress.layer, on_warning=progress.warning)
    result = run_task(request, callbacks)
    if as_json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
        return
    sys.stdout.write("\n")
    sys.stdout.flush()
    if not quiet:
        render(result, progress.console)


def task_request(task: str, document: str | None, fields: dict[str, str], *, model, budget, window, decode_policy,
                 dtype, attention, device_map, max_new_tokens, temperature, top_p, seed, truncate, password):
    """Build a TaskRequest from the shared options."""
    from cake_cli.engine.sampling import SamplingConfig
    from cake_cli.errors import UsageError
    from cake_cli.runner import TaskRequest

    if temperature < 0 or not 0 < top_p <= 1:
        raise UsageError("--temperature must be >= 0 and --top-p in (0, 1]", "e.g. --temperature 0.7 --top-p 0.9")
    if max_new_tokens is not None and max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be at least 1 (got {max_new_tokens})")
    return TaskRequest(task=task, document=resolve_document(document), fields=fields, model=model, budget=budget,
                       window=window, decode_policy=decode_policy, dtype=dtype, attention=attention,
                       device_map=device_map, max_new_tokens=max_new_tokens,
                       sampling=SamplingConfig(temperature, top_p, seed), truncate=truncate, password=password)


@app.command()
def summarize(document: o.Document = None, model: o.Model = None, budget: o.Budget = 1024,
              window: o.Window = None, decode_policy: o.DecodePolicy = "fixed", dtype: o.Dtype = "auto",
              attention: o.Attention = "auto", device_map: o.DeviceMap = None,
              max_new_tokens: o.MaxNewTokens = None, temperature: o.Temperature = 0.0, top_p: o.TopP = 1.0,
              seed: o.Seed = None, truncate: o.Truncate = "middle", password: o.Password = None,
              json_out: o.Json = False, quiet: o.Quiet = False) -> None:
    """Summarize a long document under a KV-cache budget; the summary streams to stdout, the report to stderr."""
    with handled():
        request = task_request("summarize", document, {}, model=model, budget=budget, window=window,
                               decode_policy=decode_policy, dtype=dtype, attention=attention, device_map=device_map,
                               max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                               truncate=truncate, password=password)
        run_and_report(request, json_out, quiet)


@app.command()
def version() -> None:
    """Print the cake-cli version."""
    typer.echo(__version__)


def main() -> None:
    """Console-script entry point."""
    app()
