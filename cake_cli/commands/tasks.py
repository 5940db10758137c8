"""Task commands: summarize (and the other long-document tasks)."""

from __future__ import annotations

import json
import sys

from cake_cli import options as o
from cake_cli.app import StderrProgress, app, handled
from cake_cli.errors import CakeError


def resolve_document(document: str | None) -> str:
    """The document argument, or '-' when text is piped in."""
    if document is not None:
        return document
    if not sys.stdin.isatty():
        return "-"
    raise CakeError("no document given", "pass a file path, or '-' to read stdin (e.g. cat notes.txt | cake summarize -)",
                    exit_code=2)


def run_and_report(request, as_json: bool, quiet: bool) -> None:
    """Run a task, stream its answer to stdout (or print JSON), and print the report on stderr."""
    from cake_cli.report import render
    from cake_cli.runner import Callbacks, run_task

    progress = StderrProgress(quiet or as_json)

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
                 dtype, attention, device_map, max_new_tokens, temperature, top_p, seed, truncate, password,
                 no_repeat_ngram=None):
    """Build a TaskRequest from the shared options."""
    from cake_cli.engine.sampling import SamplingConfig
    from cake_cli.errors import UsageError
    from cake_cli.runner import TaskRequest

    if temperature < 0 or not 0 < top_p <= 1:
        raise UsageError("--temperature must be >= 0 and --top-p in (0, 1]", "e.g. --temperature 0.7 --top-p 0.9")
    if max_new_tokens is not None and max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be at least 1 (got {max_new_tokens})")
    if no_repeat_ngram is not None and no_repeat_ngram < 0:
        raise UsageError(f"--no-repeat-ngram must be >= 0 (got {no_repeat_ngram})", "0 turns it off")
    return TaskRequest(task=task, document=resolve_document(document), fields=fields, model=model, budget=budget,
                       window=window, decode_policy=decode_policy, dtype=dtype, attention=attention,
                       device_map=device_map, max_new_tokens=max_new_tokens,
                       sampling=SamplingConfig(temperature, top_p, seed), truncate=truncate, password=password,
                       no_repeat_ngram_size=no_repeat_ngram)


@app.command()
def summarize(document: o.Document = None, model: o.Model = None, budget: o.Budget = 1024,
              window: o.Window = None, decode_policy: o.DecodePolicy = "fixed", dtype: o.Dtype = "auto",
              attention: o.Attention = "auto", device_map: o.DeviceMap = None,
              max_new_tokens: o.MaxNewTokens = None, temperature: o.Temperature = 0.0, top_p: o.TopP = 1.0,
              seed: o.Seed = None, no_repeat_ngram: o.NoRepeatNgram = None, truncate: o.Truncate = "middle", password: o.Password = None,
              json_out: o.Json = False, quiet: o.Quiet = False) -> None:
    """Summarize a long document under a KV-cache budget; the summary streams to stdout, the report to stderr."""
    with handled():
        request = task_request("summarize", document, {}, model=model, budget=budget, window=window,
                               decode_policy=decode_policy, dtype=dtype, attention=attention, device_map=device_map,
                               max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
                               truncate=truncate, password=password, no_repeat_ngram=no_repeat_ngram)
        run_and_report(request, json_out, quiet)
