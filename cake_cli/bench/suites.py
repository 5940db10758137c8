"""What `cake bench quality` and `tau-search` run: tasks, suites of cases, method variants, result rows.

Light (no torch), so the command line checks every option before the model loads. Methods are
named pairings of an allocation and an indicator (`engine.methods.METHODS`), or any pairing
written `allocation+indicator` (paper Sec. 5.5), e.g. `cake+snapkv` = CAKE's budgets with
SnapKV's indicator. `full` (no eviction) is run once per case and shown at every budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from cake_cli.bench.genre_cases import GenreSuite, genre_case_id
from cake_cli.bench.needles import NEEDLE_TASKS
from cake_cli.bench.scoring import REAL_WEIGHTS
from cake_cli.bench.splits import case_id, check_split
from cake_cli.engine.allocation import ALLOCATIONS, SCORE_ALLOCATIONS
from cake_cli.engine.config import POOL_KINDS, ConfigError
from cake_cli.engine.indicators import GAMMA_INDICATORS, INDICATORS, PROFILE_POOLED
from cake_cli.engine.methods import BEYOND_PAPER, METHODS, QUESTION_METHODS, resolve
from cake_cli.errors import UsageError, unknown_name
from cake_cli.tasks.answers.abstain import DEFAULT_ABSTAIN

# `cake bench speed` (cake-grow: CAKE with the grow decode policy)
SPEED_METHODS = ("full", "snapkv", "pyramidkv", "cake", "cake-grow", "cake-chunk")
SPEED_DEFAULT = tuple(m for m in SPEED_METHODS if m not in BEYOND_PAPER)  # cake-chunk (not the paper's) when named
TASKS = (*NEEDLE_TASKS, "qa")
CASE_DRAW = 2  # how cases are drawn from the data; 2: QA questions per (length, depth, repeat), 1: per (depth, repeat)
TEMPLATES = {
    "s-rt": "bench_needle",
    "m-rs": "bench_needle",
    "m-each": "bench_needle",  # the genre suite: one of three facts asked (`bench.facts`)
    "m-rt": "bench_multi_needle",
    "qa": "bench_qa",
}
REAL_TASKS = tuple(REAL_WEIGHTS)  # real, real-absent, real-cut
REAL_TEMPLATE = "qa"  # the real-document suite asks what `cake qa` asks: cite the passage or abstain


@dataclass(frozen=True)
class Suite:
    """Which cases to run: every task x length x depth x repeat of one split."""

    tasks: tuple[str, ...]
    lengths: tuple[int, ...]  # nominal prompt lengths, tokens (clamped to the model's limit)
    depths: tuple[float, ...]  # fractions of the document
    repeats: int  # cases per (task, depth), each with other facts / QA item and haystack offset
    split: str = "eval"

    def specs(self) -> list[tuple[str, int, float, int]]:
        """(task, index, depth, length) of every case; `index` numbers the cases of a task."""
        check_split(self.split)
        out = []
        for task in self.tasks:
            for d_idx, depth in enumerate(self.depths):
                for r in range(self.repeats):
                    index = d_idx * self.repeats + r
                    out.extend((task, index, depth, length) for length in self.lengths)
        return out


def spec_id(spec: tuple) -> str:
    """The case id of one of a suite's specs: (task, index, depth, length) of `Suite`, or
    (task, index, depth, length, genre) of `genre_cases.GenreSuite` (the id then names the genre)."""
    _, index, depth, *_ = spec
    return genre_case_id(spec[4], index, depth) if len(spec) == 5 else case_id(index, depth)


def grid_cost(suite, variants: list, budgets: list[int]) -> tuple[int, int]:
    """(recorded prefills, replays) of a whole grid before anything ran: one prefill per case and
    length, one replay (and decode, unless two configs keep the same tokens) per variant and budget
    ("full": one per case)."""
    prefills = len(suite.specs())
    return prefills, prefills * sum(1 if v.allocation is None else len(budgets) for v in variants)


def cell_keys(suite: Suite | GenreSuite, variants: list, budgets: list[int]) -> set[tuple]:
    """The resume keys (`result_key`) of every answer the grid holds: each case of `suite` (task,
    case id, length) x each variant x each budget ("full": budget None). A stored row whose key is
    outside this set belongs to another setting (other depths, repeats, lengths, tasks, methods or
    budgets). Within it, a case's content is fixed by its key (the case id names depth and index)."""
    return {
        result_key(spec[0], spec_id(spec), spec[3], v.name, b)
        for spec in suite.specs()
        for v in variants
        for b in ([None] if v.allocation is None else budgets)
    }


@dataclass(frozen=True)
class RealSuite:
    """`--suite real`: the real-document QA set (`bench.real_docs`), each question asked once per
    context length. A document longer than a length is middle-cut to it, as `cake qa` cuts it to
    the model's limit; a question whose passage the cut left out is then one to abstain on."""

    lengths: tuple[int, ...]  # prompt limits, tokens (clamped to the model's limit)
    documents: tuple[str, ...] = ()  # document ids of the set (empty: all)
    quick: bool = False  # two questions per document: its first answerable and first unanswerable one
    long: str = "middle"  # a document longer than the length: "middle" (cut) or "sections" (`tasks.sections`)
    subset: str | None = None  # the half of the set's split by document asked ("tune", "held-out"); None: all
    abstain: str = DEFAULT_ABSTAIN  # an unsupported answer: "never" scored as given, "unsupported" withheld
    versus: str = "cake"  # the method whose paired intervals against every other the report prints
    doubt_threshold: float | None = None  # --abstain doubt: the model profile's (None: abstain.DOUBT_THRESHOLD)
    tasks: tuple[str, ...] = REAL_TASKS  # the row tasks (`scoring.REAL_WEIGHTS`)
    split: str = "real"
    depths: tuple[float, ...] = ()
    repeats: int = 1


SUITES = ("needle", "real", "genres")  # `--suite`: NeedleBench + SQuAD/HotpotQA, real documents, five genres
REAL_LENGTHS = (32768,)  # the default: each model's own limit (32768 is clamped to it)

EVAL_SUITE = Suite(TASKS, (2048, 4096, 8192), (0.1, 0.5, 0.9), 2, "eval")
QUICK_SUITE = Suite(TASKS, (2048,), (0.25, 0.75), 1, "eval")
TUNE_SUITE = Suite(TASKS, (4096, 8192), (0.2, 0.5, 0.8), 1, "tune")


@dataclass(frozen=True)
class Variant:
    """A method to benchmark: a named method, or an allocation+indicator pairing, optional taus
    and indicator settings (the profile search, `bench.tau_search`).

    `allocation` is None for "full" (no eviction). `question_window`: the prefill scores with the
    question's window rows only (`engine.methods.QUESTION_METHODS`), a count each case gives `config`.
    `select`: the method runs on the prompt `cake qa --prefill select` reads (`NAME@select`, real suite
    only: `bench.quality.selected`).
    """

    name: str
    allocation: str | None
    indicator: str | None
    taus: tuple[float, float] | None = None  # override the profile's (tau1, tau2)
    pooling: tuple[str, int] | None = None  # override the profile's (pool kind, kernel)
    gamma: float | None = None  # override the profile's gamma (Eq. 11)
    chunk: int | None = None  # override CakeConfig.chunk (tokens per chunk of the `chunk` indicator)
    question_window: bool = False  # score with the question's rows (CakeConfig.score_rows = question_rows)
    select: bool = False  # read only the tokens GemFilter's early-layer selection keeps (`--prefill select`)
    select_layer: int | None = None  # the selection's layer (`--select-layer`; None: `selection.default_layer`)
    rank_layer: int | None = None  # override CakeConfig.rank_layer (`NAME@rank:L`)

    def config(self, base, question_rows: int | None = None):
        """`base` (a CakeConfig for one budget) switched to this variant; None for "full". With
        `question_window`, `question_rows` (the prompt's tokens from the question on,
        `tasks.question_window.question_rows`) becomes its `score_rows` when given."""
        if self.allocation is None:
            return None
        config = replace(base, allocation=self.allocation, indicator=self.indicator)
        if self.question_window and question_rows is not None:
            config = replace(config, score_rows=question_rows)
        if self.pooling:
            config = replace(config, pool_kind=self.pooling[0], pool_kernel=self.pooling[1])
        if self.gamma is not None:
            config = replace(config, gamma=self.gamma)
        if self.chunk is not None:
            config = replace(config, chunk=self.chunk)
        if self.rank_layer is not None:
            config = replace(config, rank_layer=self.rank_layer)
        return replace(config, tau1=self.taus[0], tau2=self.taus[1]) if self.taus else config


CHUNK_SIZED = "cake-chunk:"  # `--methods cake-chunk:N`: cake-chunk with chunks of N tokens (the chunk-size search)
SELECTED = "@select"  # `--methods NAME@select[:L]`: NAME on the prompt `cake qa --prefill select` reads (real suite)
RANKED = "@rank:"  # `--methods NAME@rank:L`: the layers below L keep layer L's ranking (CakeConfig.rank_layer)
TAUED = "@tau:"  # `--methods NAME@tau:T1/T2`: NAME with the temperatures (tau1, tau2) instead of the profile's
POOLED = "@pool:"  # `--methods NAME@pool:avg5`: NAME with that pooling (kind and kernel) instead of the profile's
GAMMAED = "@gamma:"  # `--methods NAME@gamma:G`: NAME with the indicator's variance weight G instead of 200 (Eq. 11)


def chunk_variant(name: str) -> Variant:
    """`cake-chunk:N` as a Variant: CAKE's budgets keeping whole chunks of N tokens (`CakeConfig.chunk`).

    Raises:
        UsageError: N is not a whole number of at least 1.
    """
    size = name[len(CHUNK_SIZED) :]
    if not size.isdigit() or int(size) < 1:
        raise UsageError(
            f"'{name}': the chunk size must be a whole number of tokens, at least 1",
            "write cake-chunk:N, e.g. cake-chunk:20",
        )
    return Variant(name, *resolve("cake-chunk"), chunk=int(size))


def budgeted_variant(name: str, base: str, what: str, suffix: str) -> Variant:
    """The Variant named `name` of method `base` (a budgeted METHODS name or `cake-chunk:N`), for a `NAME@...`
    form that needs a budget.

    Raises:
        UsageError: `base` is not a method with a budget ("'{name}': {what}, and '{base}' is not one", with every
            budgeted method followed by `suffix` as the hint).
    """
    if base.startswith(CHUNK_SIZED):
        return replace(chunk_variant(base), name=name)
    if base not in METHODS or METHODS[base] is None:
        budgeted = [m for m, pair in METHODS.items() if pair is not None]
        raise UsageError(
            f"'{name}': {what}, and '{base}' is not one", f"write one of {', '.join(m + suffix for m in budgeted)}"
        )
    return Variant(name, *resolve(base))


def _rank(name: str, variant: Variant, layer: str) -> Variant:
    if not layer.isdigit():
        raise UsageError(f"'{name}': the ranking layer must be a whole number", f"write {variant.name}{RANKED}9")
    return replace(variant, rank_layer=int(layer))


def _select(name: str, variant: Variant, layer: str) -> Variant:
    if layer and (not layer.startswith(":") or not layer[1:].isdigit()):
        raise UsageError(f"'{name}': the selection layer must be a whole number", f"write {variant.name}{SELECTED}:9")
    return replace(variant, select=True, select_layer=int(layer[1:]) if layer else None)


def _tau(name: str, variant: Variant, text: str) -> Variant:
    t1, slash, t2 = text.partition("/")
    try:
        taus = (float(t1), float(t2))
    except ValueError:
        taus = (0.0, 0.0)
    if not ALLOCATIONS[variant.allocation].uses_stats:
        raise UsageError(
            f"'{name}': {variant.allocation} budgets read no temperatures", f"write cake-chunk{TAUED}{text}"
        )
    if not slash or min(taus) <= 0 or not all(map(math.isfinite, taus)):
        raise UsageError(
            f"'{name}': the temperatures must be two positive numbers T1/T2", f"write {variant.name}{TAUED}1/1"
        )
    return replace(variant, taus=taus)


def _pool(name: str, variant: Variant, text: str) -> Variant:
    if variant.indicator not in PROFILE_POOLED:
        raise UsageError(
            f"'{name}': the {variant.indicator} indicator has its own pooling", f"write cake-chunk{POOLED}{text}"
        )
    kind = text.rstrip("0123456789")
    kernel = text[len(kind) :]
    if kind not in POOL_KINDS or not kernel or int(kernel) % 2 == 0:
        raise UsageError(
            f"'{name}': the pooling must be a kind ({', '.join(POOL_KINDS)}) and an odd kernel",
            f"write {variant.name}{POOLED}avg5",
        )
    return replace(variant, pooling=(kind, int(kernel)))


def _gamma(name: str, variant: Variant, text: str) -> Variant:
    if variant.indicator not in GAMMA_INDICATORS:
        raise UsageError(
            f"'{name}': the {variant.indicator} indicator reads no variance weight", f"write cake-chunk{GAMMAED}{text}"
        )
    try:
        gamma = float(text)
    except ValueError:
        gamma = -1.0
    if not (gamma >= 0 and math.isfinite(gamma)):
        raise UsageError(f"'{name}': the variance weight must be a number >= 0", f"write {variant.name}{GAMMAED}200")
    return replace(variant, gamma=gamma)


# `NAME@SETTING...`: marker -> (what it does to NAME, a short example for the hint, how it is read)
SETTINGS = {
    RANKED: ("ranks a method with a budget", "9", _rank),
    SELECTED: ("runs a method with a budget on the selected prompt", "", _select),
    TAUED: ("sets the temperatures of a method with a budget", "1/1", _tau),
    POOLED: ("sets the pooling of a method with a budget", "avg5", _pool),
    GAMMAED: ("sets the variance weight of a method with a budget", "200", _gamma),
}


def set_variant(name: str) -> Variant:
    """`NAME@SETTING[@SETTING...]` as a Variant: method NAME (a budgeted METHODS name or `cake-chunk:N`) with
    each setting applied in turn: `@rank:L` (every layer below L keeps the tokens layer L's indicator ranks
    highest, `CakeConfig.rank_layer`), `@select[:L]` (NAME on the tokens `cake qa --prefill select` keeps,
    `bench.quality.selected`), `@tau:T1/T2` (CAKE's temperatures, Eq. 7, instead of the profile's), `@pool:KINDK`
    (the indicator's pooling along tokens, docs/method.md §Pooling, instead of the profile's), `@gamma:G` (the
    eviction indicator's variance weight, Eq. 11, instead of the paper's 200). A layer past the
    model's is refused when the model is loaded.

    Raises:
        UsageError: an unknown setting, NAME not a method with a budget, or a setting's value malformed
            (a layer not a whole number, temperatures not two positive numbers, a pooling not avg/max with an odd
            kernel, a variance weight not a finite number >= 0 or on an indicator without one).
    """
    base, *settings = name.split("@")
    marks = [next((m for m in SETTINGS if ("@" + s).startswith(m)), None) for s in settings]
    if None in marks:
        bad = settings[marks.index(None)]
        forms = ", ".join(f"{base}{m}{example}" for m, (_, example, _) in SETTINGS.items())
        raise UsageError(f"'{name}': unknown setting '@{bad}'", f"write one of {forms}")
    what, example, _ = SETTINGS[marks[0]]
    variant = replace(budgeted_variant(name, base, f"{marks[0].rstrip(':')} {what}", marks[0] + example), name=base)
    for mark, setting in zip(marks, settings):
        variant = SETTINGS[mark][2](name, variant, ("@" + setting)[len(mark) :])
    return replace(variant, name=name)


def parse_variants(methods: str, pairings: str = "") -> list[Variant]:
    """Variants from `--methods a,b` (METHODS names) and `--pairings alloc+ind,...` (`methods.resolve`).

    Raises:
        UsageError: an unknown name (with "did you mean" and the valid names), or no method.
    """
    out: list[Variant] = []
    for option, text in (("--methods", methods), ("--pairings", pairings)):
        for name in (m.strip() for m in text.split(",")):
            if not name:
                continue
            if option == "--methods" and "@" in name:
                out.append(set_variant(name))
                continue
            if option == "--methods" and name in QUESTION_METHODS:
                out.append(Variant(name, *resolve(QUESTION_METHODS[name]), question_window=True))
                continue
            if option == "--methods" and name.startswith(CHUNK_SIZED):
                out.append(chunk_variant(name))
                continue
            if option == "--methods" and name not in METHODS:
                raise unknown_name("method", name, [*METHODS, *QUESTION_METHODS])
            try:
                if option == "--pairings" and "+" not in name:
                    raise ConfigError("method", "not allocation+indicator")
                pair = resolve(name)
            except ConfigError as exc:
                raise UsageError(
                    f"unknown pairing '{name}' ({exc})",
                    f"write allocation+indicator with allocation in {', '.join(ALLOCATIONS)} and "
                    f"indicator in {', '.join(INDICATORS)}, e.g. cake+snapkv",
                ) from None
            if pair is not None and pair[0] in SCORE_ALLOCATIONS:
                raise UsageError(
                    f"'{name}': allocation {pair[0]} ranks reconstruction scores, only with --scoring reconstruct",
                    f"choose an allocation in {', '.join(ALLOCATIONS)}",
                )
            out.append(Variant(name, *(pair or (None, None))))
    if not out:
        raise UsageError("no method to benchmark", "give --methods, e.g. full,snapkv,cake")
    names = [v.name for v in out]
    return [v for i, v in enumerate(out) if v.name not in names[:i]]  # drop repeats


@dataclass(frozen=True)
class CaseResult:
    """One answer: a (case, length, method, budget) cell. Times in seconds; scores in [0, 1]."""

    task: str
    case_id: str
    split: str
    length: int  # nominal
    method: str
    budget: int | None  # None for "full"
    prompt_tokens: int
    depth: float
    score: float  # NeedleBench's rule (needle tasks) or token F1 (qa), `scoring.score_answer`
    prediction: str
    tau1: float | None
    tau2: float | None
    seconds: float  # replay + decode
    record_seconds: float  # the shared full prefill of this case
    source: str
    exact: float | None = None  # 1.0 / 0.0 by `scoring.exact_answer` (None in files from before it)
    abstained: bool | None = None  # real suite: the reply said the document does not hold the answer
    support: str | None = None  # real suite: located / unsupported / abstained (`tasks.answers.cite`)
    genre: str | None = None  # genre suite: the haystack's genre (`bench.genres`); `split` is its split
    survival: list | None = None  # --diagnose survival: [L][F] share of each fact's tokens kept (`bench.survival`)
    kept: list | None = None  # --diagnose survival, real suite: [L] tokens each layer kept per KV head
    check: float | None = None  # real suite, --abstain checked: P(yes); doubt: P(abstaining) (`tasks.answers.check`)
    sections: list | None = None  # real suite, --long sections: [[reply, support status] of each section]

    @property
    def key(self) -> tuple:
        return result_key(self.task, self.case_id, self.length, self.method, self.budget)


def result_key(task: str, cid: str, length: int, method: str, budget: int | None) -> tuple:
    """The resume key of one cell."""
    return (task, cid, int(length), method, None if budget is None else int(budget))
