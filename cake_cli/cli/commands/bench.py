"""`cake bench …`: benchmarks that print numbers (speed and memory; quality; tau search).

Every option is checked here (no torch) before `cli.runners.bench` loads the model and runs.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from cake_cli.bench.genre_cases import GENRE_SUITE, QUICK_GENRE_SUITE, SEARCH_GENRE_SUITE
from cake_cli.bench.genres import GENRE_SPLITS
from cake_cli.bench.suites import (
    EVAL_SUITE,
    QUICK_SUITE,
    TUNE_SUITE,
    grid_cost,
    parse_variants,
)
from cake_cli.cli import options as o
from cake_cli.cli.app import HELP_STYLE, app, handled
from cake_cli.cli.bench_options import (
    Depths,
    Genres,
    Haystack,
    Lengths,
    Methods,
    Output,
    Pairings,
    Quick,
    Repeats,
    SearchGrid,
    Seed,
    Tasks,
    Threads,
    float_list,
    genre_suite_from,
    grid_setup,
    int_list,
    real_suite_from,
    search_grid,
    suite_from,
)
from cake_cli.engine.methods import PAPER_METHODS
from cake_cli.errors import UsageError, unknown_name
from cake_cli.models.profiles import profile_of
from cake_cli.tasks.answers.abstain import DEFAULT_ABSTAIN

bench_app = typer.Typer(**HELP_STYLE, no_args_is_help=True, help="Benchmarks that print numbers.")
app.add_typer(bench_app, name="bench")


@bench_app.command("quality")
def quality(
    model: o.Model = None,
    window: o.Window = None,
    methods: Methods = ",".join(PAPER_METHODS),
    pairings: Pairings = "",
    budgets: Annotated[
        str | None,
        typer.Option(
            metavar="LIST",
            show_default=False,
            help="KV budgets B, tokens per layer on average, window included; comma-separated. "
            "Default: 64,128,256,512,1024 (--quick: 128,256,512).",
        ),
    ] = None,
    suite: Annotated[
        str,
        typer.Option(
            metavar="NAME",
            help="needle: NeedleBench-style retrieval and SQuAD/HotpotQA (synthetic haystacks); real: questions on "
            "real documents that Debian packages and CPython ship (bench/data/real_qa.yaml), answered as `cake qa` "
            "answers them: F1 and exact against gold, abstention accuracy on the unanswerable ones; genres: varied "
            "invented facts in five genres of real text (essays, wiki, code, manual, reference), tune and held-out "
            "genres reported apart, with paired bootstrap intervals of CAKE's differences.",
        ),
    ] = "needle",
    documents: Annotated[
        str | None,
        typer.Option(
            metavar="LIST",
            show_default=False,
            help="--suite real: the set's document ids to ask, comma-separated (default: every installed one).",
        ),
    ] = None,
    split: Annotated[
        str | None,
        typer.Option(
            "--split",
            metavar="HALF",
            show_default=False,
            help="--suite real: ask one half of the set's fixed split by document, tune or held-out (default: "
            "both); the report's paired bootstrap intervals of CAKE against every other method are that half's.",
        ),
    ] = None,
    long: Annotated[
        str,
        typer.Option(
            "--long",
            metavar="MODE",
            help="--suite real, a document longer than the context: middle (cut, as `cake qa` does by default) or "
            "sections (read in sections, as `cake qa --long sections`).",
        ),
    ] = "middle",
    abstain: Annotated[
        str,
        typer.Option(
            "--abstain",
            metavar="MODE",
            help="--suite real: an answer no passage of the document holds is scored as `cake qa --abstain MODE` "
            "shows it: doubt (withheld where a word or number is foreign to the document or the model's own "
            "probability of abstaining reaches a threshold: scored as an abstention), foreign, unsupported (every "
            "such answer withheld) or never (scored as given); checked (the benchmark's only): foreign's rule, and "
            "also withheld where the model, asked on its kept cache whether the document states its answer, says "
            "no (tasks/answers/check.py).",
        ),
    ] = DEFAULT_ABSTAIN,
    versus: Annotated[
        str | None,
        typer.Option(
            "--versus",
            metavar="METHOD",
            show_default=False,
            help="--suite real: the method (one of --methods) whose paired intervals against every other method "
            "the report prints [default: cake].",
        ),
    ] = None,
    tasks: Tasks = None,
    lengths: Lengths = None,
    depths: Depths = None,
    repeats: Repeats = None,
    haystack: Haystack = "essays",
    genres: Genres = None,
    seed: Seed = None,
    diagnose: Annotated[
        str | None,
        typer.Option(
            metavar="WHAT",
            show_default=False,
            help="survival: also store, per answer, the share of each fact's tokens every layer kept (the kept "
            "indices), and report it per method and budget.",
        ),
    ] = None,
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
    weights: o.Weights = "bf16",
    attention: o.Attention = "auto",
    json_out: o.Json = False,
) -> None:
    """Answer quality of each method x budget x context length on NeedleBench-style tasks (single- and
    multi-needle retrieval, multi-needle reasoning; Levenshtein scoring) and SQuAD/HotpotQA QA (F1),
    or (--suite real) on questions about real documents. One prefill per case is recorded and
    replayed for every method and budget. Tables go to stdout (or one JSON object with --json),
    progress to stderr."""
    with handled():
        if diagnose not in (None, "survival"):
            raise unknown_name("--diagnose", diagnose, ["survival"])
        if suite != "genres" and (genres or seed is not None):
            raise UsageError(
                "--genres and --seed apply to --suite genres only", "add --suite genres, or leave them out"
            )
        if versus is not None and suite != "real":
            raise UsageError("--versus applies to --suite real only", "add --suite real, or leave --versus out")
        if split is not None and suite != "real":
            raise UsageError("--split applies to --suite real only", "add --suite real, or leave --split out")
        if suite == "real":
            chosen = real_suite_from(
                lengths,
                documents,
                quick,
                long,
                split,
                abstain,
                versus or "cake",
                getattr(profile_of(model), "doubt_threshold", None),
                tasks=tasks,
                depths=depths,
                repeats=repeats,
            )
        elif suite == "genres":
            if long != "middle" or documents:
                raise UsageError("--long and --documents apply to --suite real only", "leave them out")
            base = QUICK_GENRE_SUITE if quick else GENRE_SUITE
            chosen = genre_suite_from(base, tasks, lengths, depths, repeats, genres, seed)
        else:
            if long != "middle":
                raise UsageError("--long applies to --suite real only", "add --suite real, or leave --long out")
            chosen = suite_from(QUICK_SUITE if quick else EVAL_SUITE, tasks, lengths, depths, repeats, suite, documents)
        sizes = int_list(budgets or ("128,256,512" if quick else "64,128,256,512,1024"), "--budgets")
        variants = parse_variants(methods, pairings)
        if versus is not None and versus not in [v.name for v in variants]:
            raise unknown_name("--versus method", versus, [v.name for v in variants])
        if suite != "real" and any(v.question_window for v in variants):
            raise UsageError(
                "cake-qwin runs on --suite real only (its cases give the question's tokens per prompt)",
                "add --suite real, or leave cake-qwin out of --methods",
            )
        if any(v.select for v in variants) and (suite != "real" or long != "middle"):
            raise UsageError(
                "NAME@select runs on --suite real with --long middle only (a selection is made per question, "
                "on one prompt)",
                "add --suite real (and leave --long sections out), or leave the @select methods out of --methods",
            )
        where = (haystack, chosen, sizes, variants, output, json_out, diagnose == "survival")
        setup = grid_setup(model, window, dtype, attention, threads, *where, weights=weights)
        from cake_cli.cli.runners import bench as bench_run  # noqa: PLC0415 - torch loads after the checks

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
    suite: Annotated[
        str,
        typer.Option(
            metavar="NAME",
            help="needle: the needle suite's tune split; genres: the multi-genre suite, searching pooling, kernel "
            "and gamma too, chosen on --choose-on genres.",
        ),
    ] = "needle",
    genres: Genres = None,
    seed: Seed = None,
    pooling: Annotated[
        str | None, typer.Option(metavar="LIST", show_default=False, help="Pooling kinds to search: avg,max.")
    ] = None,
    kernels: Annotated[
        str | None, typer.Option(metavar="LIST", show_default=False, help="Pooling kernels to search (odd): 3,5,7.")
    ] = None,
    gammas: Annotated[
        str | None,
        typer.Option(
            metavar="LIST", show_default=False, help="Indicator gammas to search (Eq. 11; default: the profile's)."
        ),
    ] = None,
    choose_on: Annotated[
        str,
        typer.Option(metavar="SPLIT", help="--suite genres: choose on the held-out or the tune genres' score."),
    ] = "held-out",
    dry_run: Annotated[
        bool,
        o._flag("--dry-run", help="Print the search's cost (prefills, replays) and stop before loading the model."),
    ] = False,
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
        if suite not in ("needle", "genres"):
            raise unknown_name("suite", suite, ["needle", "genres"])
        if choose_on not in GENRE_SPLITS:
            raise unknown_name("--choose-on split", choose_on, list(GENRE_SPLITS))
        sizes = int_list(budgets, "--budgets")
        grid1, grid2 = float_list(tau1, "--tau1", 0.01, 100.0), float_list(tau2, "--tau2", 0.01, 100.0)
        search = SearchGrid(grid1, grid2)
        if suite == "genres":
            chosen = genre_suite_from(SEARCH_GENRE_SUITE, tasks, lengths, depths, repeats, genres, seed)
            search = search_grid(grid1, grid2, pooling or "avg,max", kernels or "3,5,7", gammas, model, choose_on)
            if not set(chosen.genres) & set(GENRE_SPLITS[choose_on]):
                raise UsageError(
                    f"--genres has none of the {choose_on} genres ({', '.join(GENRE_SPLITS[choose_on])})",
                    "add one, or choose on the other side with --choose-on",
                )
        else:
            if genres or seed is not None or pooling or kernels or gammas:
                raise UsageError(
                    "--genres, --seed, --pooling, --kernels and --gammas apply to --suite genres only",
                    "add --suite genres (the profile search), or leave them out",
                )
            base_suite = TUNE_SUITE if not quick else replace(QUICK_SUITE, split="tune")
            chosen = suite_from(base_suite, tasks, lengths, depths, repeats)
        variants = search.variants()
        where = (haystack, chosen, sizes, variants, output, json_out)
        setup = grid_setup(model, window, dtype, attention, threads, *where)
        if dry_run:
            prefills, replays = grid_cost(chosen, variants, sizes)
            typer.echo(
                f"{len(variants)} configs x {len(sizes)} budgets: {prefills} recorded prefills, {replays} replays "
                f"(each a greedy decode unless two configs keep the same tokens; {replays // max(prefills, 1)} per "
                "prefill)"
            )
            return
        from cake_cli.cli.runners import bench as bench_run  # noqa: PLC0415 - torch loads after the checks

        bench_run.tau_search(setup, search, write_profile)
