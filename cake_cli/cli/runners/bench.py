"""Running checked benchmarks and printing their tables (the heavy half of `cli.commands.bench`:
it loads torch and the model)."""

from __future__ import annotations

import datetime
import importlib.util
import json
import sys
import time
from pathlib import Path

import torch
from rich.markup import escape
from rich.table import Table

from cake_cli.bench.genre_cases import GenreSuite
from cake_cli.bench.genres import GENRE_SPLITS
from cake_cli.bench.quality.plot import plot as draw
from cake_cli.bench.quality.real import count_steps as count_real_steps
from cake_cli.bench.quality.real import run_real
from cake_cli.bench.quality.report import (
    INTERVALS_HEADING,
    RealInterval,
    check_resumable,
    fmt_score,
    interval_grid,
    keep_checks,
    load_results,
    of_setting,
    real_intervals,
    real_target_checks,
    row_key,
    rows_as_dicts,
    save_results,
    select_checks,
    summarize,
    target_checks,
)
from cake_cli.bench.quality.run import Model as QualityModel
from cake_cli.bench.quality.run import count_steps, expected_taus, run_grid
from cake_cli.bench.quality.tables import intervals_markdown, rich_tables
from cake_cli.bench.quality.tables import markdown as to_markdown
from cake_cli.bench.real_docs import load_set, open_documents
from cake_cli.bench.scoring import GENRE_WEIGHTS, REAL_WEIGHTS, TASK_WEIGHTS
from cake_cli.bench.suites import CASE_DRAW, RealSuite, cell_keys
from cake_cli.bench.tau_search import choose, write_profile_taus
from cake_cli.cli.bench_options import GridSetup, SearchGrid
from cake_cli.cli.progress import console, stderr_console
from cake_cli.cli.runners.bench_common import command_line, load, machine, progress_bar
from cake_cli.cli.runners.bench_genres import genres_report, print_survival, profile_table, reference_scores
from cake_cli.cli.runners.bench_real import diagnosis_markdown, print_real_diagnosis
from cake_cli.files import write_atomic
from cake_cli.models.loader import LoadedModel
from cake_cli.tasks.runner import prompt_limit, stop_token_ids
from cake_cli.tasks.threads import using

# ---- quality grids (quality, tau search) ------------------------------------------------------


def _meta(loaded: LoadedModel, setup: GridSetup, extra: dict) -> dict:
    suite = setup.suite
    return {
        "model": loaded.name,
        "split": suite.split,
        "haystack": setup.haystack,
        "window": next(iter(setup.configs.values())).window,
        "tasks": list(suite.tasks),
        "lengths": list(suite.lengths),
        "depths": list(suite.depths),
        "repeats": suite.repeats,
        "draw": CASE_DRAW,
        **(
            {
                "documents": list(suite.documents),
                "subset": suite.subset,
                "quick": suite.quick,
                "long": suite.long,
                "abstain": suite.abstain,
                "doubt_threshold": suite.doubt_threshold,
            }
            if isinstance(suite, RealSuite)
            else {}
        ),
        **({"genres": list(suite.genres), "seed": suite.seed} if isinstance(suite, GenreSuite) else {}),
        "device": str(loaded.device),
        "dtype": str(loaded.dtype).replace("torch.", ""),
        "weights": loaded.weights,
        "threads": torch.get_num_threads(),
        "machine": machine(),
        "command": command_line(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        **extra,
    }


def grid_rows(setup: GridSetup, rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(rows of this run's setting, the others) of a results file. NeedleBench/QA grids: the rows
    whose resume key is one of the grid's cells, with the taus this run uses (`report.of_setting`);
    the real-document suite: its methods, budgets, tasks, lengths and documents."""
    if not isinstance(setup.suite, RealSuite):
        cells, taus = (
            cell_keys(setup.suite, setup.variants, list(setup.configs)),
            expected_taus(setup.variants, setup.configs),
        )
        return of_setting(rows, cells, taus)
    names, suite = {v.name for v in setup.variants}, setup.suite

    def mine(r: dict) -> bool:
        return (
            r["method"] in names
            and (r["budget"] is None or r["budget"] in setup.configs)
            and r["task"] in suite.tasks
            and r["length"] in suite.lengths
            and (not suite.documents or r["source"] in suite.documents)
        )

    return [r for r in rows if mine(r)], [r for r in rows if not mine(r)]


def run_setup(title: str, setup: GridSetup, extra_meta) -> tuple[LoadedModel, dict, list[dict]]:
    """Load the model, resume `setup.output`, run the pending cells with a progress bar, save after
    every case. Returns (loaded model, meta, the rows of this run's setting: `report.of_setting`)."""
    loaded = load(setup.model, setup.dtype, setup.attention, setup.weights)
    budgets = list(setup.configs)
    runner_model = QualityModel(loaded.model, loaded.tokenizer, prompt_limit(loaded, 64), stop_token_ids(loaded))
    meta = _meta(loaded, setup, extra_meta)
    output = setup.output
    old_meta, rows = load_results(output) if output else ({}, [])
    if output:
        check_resumable(output, old_meta, meta)
    real = isinstance(setup.suite, RealSuite)
    mine, others = grid_rows(setup, rows)
    if others:
        stderr_console().print(
            f"[dim]{escape(str(output))}: {len(others)} stored results of another setting (other tasks, lengths, "
            "depths, repeats, methods, budgets or taus) stay in the file and out of these tables[/]"
        )
    done = {row_key(r) for r in mine}
    if real:
        documents, notes = open_documents(load_set(), list(setup.suite.documents) or None)
        for note in notes:
            stderr_console().print(f"[yellow]note:[/] {escape(note)}")
        prefills, replays = count_real_steps(documents, setup.suite, setup.variants, budgets, done)
    else:
        prefills, replays = count_steps(setup.suite, setup.variants, budgets, done)
    if done:
        stderr_console().print(
            f"[dim]resuming {escape(str(output))}: {len(done)} results kept, {replays} answers in {prefills} "
            "prefills to go[/]"
        )
    stderr_console().print(
        f"[dim]cost: {prefills} recorded prefills, {replays} replays (each a greedy decode, shared where two "
        f"configs keep the same tokens): about {replays / max(prefills, 1):.0f} answers per prefill[/]"
    )
    clock = {"start": time.perf_counter(), "cases": 0}

    def save(new_rows) -> None:
        rows.extend(rows_as_dicts(new_rows))
        if output:
            save_results(output, {**old_meta, **meta}, rows)
        clock["cases"] += 1
        if clock["cases"] == 1 and prefills > 1:  # the first case measures the cost of the rest
            spent = time.perf_counter() - clock["start"]
            stderr_console().print(
                f"[dim]estimate: the first case took {spent:.0f} s; all {prefills} about "
                f"{spent * prefills / 60:.0f} min[/]"
            )

    with progress_bar() as bar:
        task = bar.add_task(title, total=prefills + replays)

        def step(label: str) -> None:
            bar.update(task, description=label)
            bar.advance(task)

        if real:
            run_real(
                runner_model,
                documents,
                setup.suite,
                setup.variants,
                budgets,
                setup.configs.__getitem__,
                done=done,
                on_case=save,
                on_step=step,
                diagnose=setup.diagnose,
            )
        else:
            run_grid(
                runner_model,
                setup.suite,
                setup.variants,
                budgets,
                setup.configs.__getitem__,
                haystack=setup.haystack,
                done=done,
                on_case=save,
                on_step=step,
                diagnose=setup.diagnose,
            )
    if output:  # also when nothing was left to run: the meta then names the command behind the tables
        save_results(output, {**old_meta, **meta}, rows)
    return loaded, meta, grid_rows(setup, rows)[0]


def quality(setup: GridSetup, plot: Path | None, markdown: Path | None) -> None:
    """`cake bench quality` after its options were checked."""
    taus = {str(b): [c.tau1, c.tau2] for b, c in setup.configs.items()}
    with using(setup.threads):
        loaded, meta, rows = run_setup("bench quality", setup, {"taus": taus})
    names, budgets = [v.name for v in setup.variants], list(setup.configs)
    real = isinstance(setup.suite, RealSuite)
    if isinstance(setup.suite, GenreSuite):
        genres_report(setup, loaded, meta, rows, plot, markdown)
        return
    weights = REAL_WEIGHTS if real else TASK_WEIGHTS
    summary = summarize(rows, names, budgets, weights=weights)
    exact = summarize(rows, names, budgets, metric="exact", weights=weights)
    intervals = real_intervals(rows, names, budgets, versus=setup.suite.versus) if real else []
    if real:  # the real suite's lines are of --versus (cake, or the CAKE-based method a profile ships)
        versus = setup.suite.versus
        checks = target_checks(summary, versus) + real_target_checks(rows, exact, versus)
        checks += keep_checks(rows, intervals, versus) + select_checks(rows, intervals, versus)
    else:
        checks = target_checks(summary)
    title = f"cake bench quality · {loaded.name}"
    half = f"{setup.suite.subset} documents" if real and setup.suite.subset else "all documents"
    output = setup.output
    png = plot or (output.with_suffix(".png") if output else None)
    err = stderr_console()
    if png and plot is None and importlib.util.find_spec("matplotlib") is None:
        err.print("[yellow]warning:[/] no plot: matplotlib is not installed (`pip install matplotlib`)")
        png = None
    if png:
        draw(summary, png, f"{title} · {setup.suite.split} split, {len(rows)} answers")
    if markdown:
        text = to_markdown(summary) + "\n" + to_markdown(exact)
        if intervals:
            text += "\n" + intervals_markdown(intervals, budgets, f"{title} · {half}")
        text += "\n" + diagnosis_markdown(rows, names, budgets)  # '' unless the real suite ran --diagnose
        write_atomic(markdown, text, "markdown file")
    if setup.json_out:
        payload = {"meta": meta, "summary": summary.to_json(), "exact": exact.to_json(), "checks": checks}
        if real:
            payload["intervals"] = [iv.to_json() for iv in intervals]
        sys.stdout.write(json.dumps(payload, indent=1) + "\n")
        return
    out = console(stderr=False)
    for summ in (summary, exact):
        for heading, table in rich_tables(summ, title):
            out.print(f"[bold]{escape(heading)}[/]")
            out.print(table)
    print_survival(out, rows, names, budgets, title)
    print_real_diagnosis(out, rows, names, budgets, title)
    if intervals:
        print_real_intervals(out, intervals, budgets, f"{title} · {half}")
    for line in checks:
        out.print(line)
    if png:
        err.print(f"[dim]plot: {escape(str(png))}[/]")
    if output:
        err.print(f"[dim]results: {escape(str(output))}[/]")


def print_real_intervals(out, intervals: list[RealInterval], budgets: list[int], title: str) -> None:
    """The real suite's paired intervals (`report.real_intervals`) as one table: a row per other
    method and question group, a column per budget."""
    out.print(f"[bold]{escape(title)} · {escape(INTERVALS_HEADING.format(versus=intervals[0].versus))}[/]")
    table = Table()
    for name in ("vs", "questions", *(f"B={b}" for b in budgets)):
        table.add_column(name, justify="left" if name in ("vs", "questions") else "right")
    for row in interval_grid(intervals, budgets):
        table.add_row(*row)
    out.print(table)


def tau_search(setup: GridSetup, search: SearchGrid, write_profile: Path | None) -> None:
    """`cake bench tau-search` after its options were checked (the profile search with --suite genres)."""
    grid1, grid2 = search.tau1, search.tau2
    extra = {"tau1_grid": grid1, "tau2_grid": grid2}
    profile = search.poolings is not None
    if profile:
        extra |= {"poolings": [f"{k}{n}" for k, n in search.poolings], "gammas": search.gammas}
        extra["choose_on"] = search.choose_on
    with using(setup.threads):
        loaded, meta, rows = run_setup("bench tau-search", setup, extra)
    suite = setup.suite
    grid = f"tau1 {{{','.join(f'{t:g}' for t in grid1)}}} x tau2 {{{','.join(f'{t:g}' for t in grid2)}}}"
    if profile:
        on = set(GENRE_SPLITS[search.choose_on]) & set(suite.genres)
        config = next(iter(setup.configs.values()))
        current = (config.pool_kind, config.pool_kernel, config.gamma)
        chosen = choose(rows, list(setup.configs), GENRE_WEIGHTS, lambda r: r.get("genre") in on, current)
        pools = ",".join(f"{k}{n}" for k, n in search.poolings)
        grid += f" x pooling {{{pools}}} x gamma {{{','.join(f'{g:g}' for g in search.gammas)}}}"
        source = (
            f"cake bench tau-search --suite genres ({datetime.date.today().isoformat()}): grid {grid}, best weighted "
            f"score summed over budgets on the {search.choose_on} genres ({', '.join(sorted(on))}; tasks "
            f"{', '.join(suite.tasks)}; lengths {','.join(map(str, suite.lengths))}; depths "
            f"{','.join(f'{d:g}' for d in suite.depths)} x {suite.repeats}; seed {suite.seed})"
        )
    else:
        chosen = choose(rows, list(setup.configs))
        source = (
            f"cake bench tau-search ({datetime.date.today().isoformat()}): grid {grid}, best weighted score per budget "
            "on the tune split "
            f"({', '.join(suite.tasks)}; lengths {','.join(map(str, suite.lengths))}; depths "
            f"{','.join(f'{d:g}' for d in suite.depths)} x {suite.repeats}; haystack {setup.haystack}), disjoint from "
            "the eval split"
        )
    references = reference_scores(rows, list(setup.configs), search) if profile else []
    if write_profile:
        write_profile_taus(write_profile, chosen, source)
    if setup.json_out:
        payload = {"meta": meta, "budgets": [c.to_json() for c in chosen], "tau_source": source}
        if profile:
            payload["references"] = [dict(zip(("method", "budget", "chosen_on", "other"), r)) for r in references]
        sys.stdout.write(json.dumps(payload, indent=1) + "\n")
        return
    out = console(stderr=False)
    for c in chosen:
        out.print(
            f"[bold]tau search · {escape(loaded.name)} · B = {c.budget} · weighted score x 100 "
            f"({c.cases} answers per pair)[/]"
        )
        table = Table()
        table.add_column("tau1 \\ tau2")
        for t2 in grid2:
            table.add_column(f"{t2:g}", justify="right")
        for t1 in grid1:
            cells = (
                ("[bold]" if (t1, t2) == c.best else "") + f"{100 * c.scores[(t1, t2)]:.1f}"
                if (t1, t2) in c.scores
                else "-"
                for t2 in grid2
            )
            table.add_row(f"{t1:g}", *cells)
        out.print(table)
        out.print(f"B={c.budget}: best tau1 = {c.best[0]:g}, tau2 = {c.best[1]:g} (score {100 * c.scores[c.best]:.1f})")
        if c.indicator is not None:
            out.print(profile_table(c, search.choose_on))
    for method, budget, mine, other in references:
        out.print(
            f"reference B={budget}: {method} {fmt_score(mine)} on the {search.choose_on} genres, "
            f"{fmt_score(other)} on the others"
        )
    if write_profile:
        stderr_console().print(f"[dim]wrote the taus into {escape(str(write_profile))}[/]")
