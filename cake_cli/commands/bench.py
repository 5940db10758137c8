"""`cake bench …`: benchmarks that print numbers (speed and memory; quality)."""

from __future__ import annotations

import json
import platform
import sys
from typing import Annotated

import typer

from cake_cli import options as o
from cake_cli.app import app, handled, stderr_console
from cake_cli.errors import UsageError

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks that print numbers.")
app.add_typer(bench_app, name="bench")


def int_list(text: str, what: str) -> list[int]:
    """'1024,2048' -> [1024, 2048]; UsageError naming `what` otherwise."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{what} must be comma-separated whole numbers, got '{text}'", "e.g. 1024,2048") from None
    if not values or min(values) < 1:
        raise UsageError(f"{what} must be positive whole numbers, got '{text}'")
    return values


def machine() -> str:
    """A one-line description of this machine."""
    import os

    import torch

    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads, python {platform.python_version()}")


@bench_app.command("speed")
def speed(model: o.Model = None, budget: o.Budget = 256, window: o.Window = None,
          lengths: Annotated[str, typer.Option(help="Prompt lengths in tokens, comma-separated.")] = "1024,2048,4096,8000",
          methods: Annotated[str, typer.Option(help="Comma-separated: full, snapkv, pyramidkv, cake, cake-grow.")]
          = "full,snapkv,pyramidkv,cake,cake-grow",
          new_tokens: Annotated[int, typer.Option(help="Tokens generated per run.")] = 32,
          repeats: Annotated[int, typer.Option(help="Runs per case; the median is reported.")] = 3,
          dtype: o.Dtype = "auto", attention: o.Attention = "auto", json_out: o.Json = False) -> None:
    """Prefill seconds, decode tokens/s, KV bytes (kept and peak during prefill), peak process memory
    and eviction overhead of each method, side by side, with ratios vs the full cache."""
    with handled():
        from cake_cli.bench.corpus import python_docs_text
        from cake_cli.bench.speed import SPEED_METHODS, ratios, run_speed
        from cake_cli.bench.speed_report import speed_table
        from cake_cli.engine.attention import default_backend, use_cake_attention
        from cake_cli.loader import load_model, profile_of
        from cake_cli.runner import TaskRequest, cake_config_for

        sizes = int_list(lengths, "--lengths")
        names = [m.strip() for m in methods.split(",") if m.strip()]
        unknown = [m for m in names if m not in SPEED_METHODS]
        if unknown:
            raise UsageError(f"unknown method(s) {', '.join(unknown)}", f"choose from {', '.join(SPEED_METHODS)}")
        if new_tokens < 2 or repeats < 1:
            raise UsageError("--new-tokens must be >= 2 and --repeats >= 1")
        base, _ = cake_config_for(profile_of(model), TaskRequest(task="bench", document="-", budget=budget,
                                                                  window=window))
        err = stderr_console()
        loaded = load_model(model, dtype=dtype, progress=lambda m: err.print(f"[dim]{m}[/]"))
        use_cake_attention(loaded.model, default_backend(loaded.device) if attention == "auto" else attention)
        ids = loaded.tokenizer(python_docs_text(), add_special_tokens=False)["input_ids"]
        limit = loaded.profile.max_prompt_tokens if loaded.profile else len(ids)
        if max(sizes) > min(len(ids), limit):
            raise UsageError(f"--lengths goes up to {max(sizes)} tokens; this model takes at most {limit}")
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        total = (len(sizes) * len(names) + 1) * repeats
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                      console=err, transient=True) as bar:
            task = bar.add_task("bench speed", total=total)

            started = [0]

            def on_case(label: str) -> None:
                bar.update(task, description=label, completed=started[0])
                started[0] += 1

            rows = run_speed(loaded.model, ids, base, lengths=sizes, methods=names, new_tokens=new_tokens,
                             repeats=repeats, on_case=on_case)
        data = ratios(rows)
        meta = {"model": loaded.name, "device": str(loaded.device), "dtype": str(loaded.dtype).replace("torch.", ""),
                "budget": budget, "window": base.window, "new_tokens": new_tokens, "repeats": repeats,
                "machine": machine(), "command": "cake " + " ".join(sys.argv[1:])}
        if json_out:
            sys.stdout.write(json.dumps({"meta": meta, "rows": data}, indent=2) + "\n")
            return
        from rich.console import Console

        Console().print(speed_table(data, f"cake bench speed · {meta['model']} · B = {budget} · {meta['machine']}"))
