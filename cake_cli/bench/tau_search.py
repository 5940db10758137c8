"""`cake bench tau-search`: grid search of CAKE's temperatures (tau1, tau2) for one model, and
(with --pooling / --kernels / --gammas) of its indicator's pooling, kernel and gamma too.

The paper tunes tau1 in 0.2-2 and tau2 in 0.4-3 by grid search (Appendix, implementation
details). We score every pair of the grid with the quality benchmark's cases of the `tune`
split (disjoint from `eval`: other haystack text, other invented facts, other SQuAD articles and
HotpotQA items; see `datasets` and `needles`), at each budget separately (a profile holds one
point per budget), and keep the best pair per budget. One recorded prefill per case serves all
pairs; pairs whose allocations keep the same tokens share one decode.

Choice: highest weighted score (`scoring.TASK_WEIGHTS`); ties go to the higher score summed over
all budgets searched, then to the pair nearest (1, 1) in log space (the authors' fallback).

Profile search (issue 23, `--suite genres`): every point is (tau1, tau2, pooling, kernel, gamma),
named "cake@0.5,2.2/max7/g200". A profile holds one pooling, kernel and gamma for all budgets,
so the indicator setting with the highest score summed over the budgets (each at its best taus)
is chosen first, then the best taus per budget under it. Scores are computed on the cases a
`cases` predicate selects (the held-out genres by default, as the issue asks; the tune genres'
scores are reported beside them, so a setting that only wins where it was chosen shows).
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from cake_cli.bench.scoring import TASK_WEIGHTS, weighted_overall
from cake_cli.bench.suites import Variant
from cake_cli.errors import CakeError
from cake_cli.files import write_atomic
from cake_cli.models.profiles import parse_profile, validate_profile

TAU1_GRID = (0.2, 0.5, 1.0, 1.5, 2.0)  # paper range 0.2-2
TAU2_GRID = (0.4, 0.8, 1.5, 2.2, 3.0)  # paper range 0.4-3
TAU_BUDGETS = (128, 1024)  # the budgets the authors publish taus for


def variant_name(tau1: float, tau2: float, pooling: tuple[str, int] | None = None, gamma: float | None = None) -> str:
    """The method name of one grid point in the results file, e.g. "cake@0.5,2.2" (taus only) or
    "cake@0.5,2.2/max7/g200" (a profile-search point)."""
    name = f"cake@{tau1:g},{tau2:g}"
    return name if pooling is None else f"{name}/{pooling[0]}{pooling[1]}/g{gamma:g}"


def tau_variants(tau1s=TAU1_GRID, tau2s=TAU2_GRID) -> list[Variant]:
    """CAKE (allocation and indicator) at every (tau1, tau2) of the grid."""
    return [Variant(variant_name(t1, t2), "cake", "cake", (t1, t2)) for t1 in tau1s for t2 in tau2s]


def profile_variants(tau1s, tau2s, poolings: list[tuple[str, int]], gammas: list[float]) -> list[Variant]:
    """CAKE at every (tau1, tau2, pooling, kernel, gamma) of the profile-search grid."""
    return [
        Variant(variant_name(t1, t2, p, g), "cake", "cake", (t1, t2), p, g)
        for p in poolings
        for g in gammas
        for t1 in tau1s
        for t2 in tau2s
    ]


@dataclass(frozen=True)
class TauScores:
    """Weighted score of every grid pair at one budget (under the chosen indicator setting), the
    pair chosen, and (profile search) every point's score on the chosen-on and the other cases."""

    budget: int
    scores: dict  # (tau1, tau2) -> weighted score in [0, 1]
    best: tuple[float, float]
    cases: int  # rows behind each pair's score
    indicator: tuple | None = None  # (pool kind, kernel, gamma) chosen; None: the profile's
    points: dict = field(default_factory=dict)  # (tau1, tau2, kind, kernel, gamma) -> (chosen-on, other) score

    def to_json(self) -> dict:
        out = {
            "budget": self.budget,
            "best": {"tau1": self.best[0], "tau2": self.best[1], "score": self.scores[self.best]},
            "cases": self.cases,
            "grid": [{"tau1": t1, "tau2": t2, "score": s} for (t1, t2), s in sorted(self.scores.items())],
        }
        if self.indicator is not None:
            out["best"].update(pooling=self.indicator[0], kernel=self.indicator[1], gamma=self.indicator[2])
            out["points"] = [
                {"tau1": p[0], "tau2": p[1], "pooling": p[2], "kernel": p[3], "gamma": p[4], "score": s, "other": o}
                for p, (s, o) in sorted(self.points.items(), key=str)
            ]
        return out


_POINT = re.compile(r"cake@([0-9.]+),([0-9.]+)(?:/(avg|max)(\d+)/g([0-9.]+))?")


def parse_point(method: str) -> tuple | None:
    """(tau1, tau2, pool kind, kernel, gamma) of a grid method name (kind, kernel, gamma None for a
    taus-only name), or None for any other method."""
    m = _POINT.fullmatch(method)
    if not m:
        return None
    t1, t2, kind, kernel, gamma = m.groups()
    return float(t1), float(t2), kind, None if kernel is None else int(kernel), None if gamma is None else float(gamma)


def _weighted(rows, budgets, weights, cases) -> tuple[dict, dict]:
    """({(budget, point): weighted score}, {(budget, point): {task: scores}}) of the grid rows `cases` selects."""
    by: dict = {}
    for r in rows:
        point = parse_point(r["method"])
        if point is not None and r["budget"] in budgets and (cases is None or cases(r)):
            by.setdefault((r["budget"], point), {}).setdefault(r["task"], []).append(r["score"])
    scored = {k: weighted_overall({t: sum(v) / len(v) for t, v in tasks.items()}, weights) for k, tasks in by.items()}
    return scored, by


def choose(
    rows: list[dict], budgets=TAU_BUDGETS, weights=TASK_WEIGHTS, cases=None, prefer: tuple | None = None
) -> list[TauScores]:
    """Score each grid point per budget from results rows and pick the best (module docstring).

    Args:
        weights: task weights of the overall score; cases: predicate selecting the rows chosen on
            (None: all); the other rows' scores are reported beside them.
        prefer: the profile's own (pool kind, kernel, gamma): among settings that tie on the rows
            chosen on and then on the other rows, the one kept (else the first by name).

    Raises:
        ValueError: no grid rows for a budget.
    """
    weighted, by = _weighted(rows, budgets, weights, cases)
    other, _ = _weighted(rows, budgets, weights, None if cases is None else (lambda r: not cases(r)))
    settings = sorted({p[2:] for _, p in weighted}, key=str)

    def best_total(scored: dict, s: tuple) -> float:
        return sum(max((v for (bb, p), v in scored.items() if bb == b and p[2:] == s), default=0.0) for b in budgets)

    if not settings:
        raise ValueError(f"no tau-search results at budget {budgets[0] if budgets else '-'}")
    ranks = {s: (round(best_total(weighted, s), 9), round(best_total(other, s), 9), s == prefer) for s in settings}
    setting = min(settings, key=lambda s: (tuple(-x for x in ranks[s]), str(s)))
    total: dict = {}
    for (_, p), s in weighted.items():
        if p[2:] == setting:
            total[p[:2]] = total.get(p[:2], 0.0) + s
    out = []
    for b in budgets:
        scores = {p[:2]: s for (bb, p), s in weighted.items() if bb == b and p[2:] == setting}
        if not scores:
            raise ValueError(f"no tau-search results at budget {b}")

        def rank(pair, scores=scores, total=total):
            return (round(scores[pair], 9), round(total[pair], 9), -(math.log(pair[0]) ** 2 + math.log(pair[1]) ** 2))

        best = max(scores, key=rank)
        count = sum(len(v) for v in by[(b, (*best, *setting))].values())
        searched = setting[0] is not None
        points = {p: (s, other.get((b, p))) for (bb, p), s in weighted.items() if bb == b} if searched else {}
        out.append(TauScores(b, scores, best, count, setting if searched else None, points))
    return out


def write_profile_taus(path: Path, chosen: list[TauScores], source: str) -> None:
    """Set the `taus:` points of the searched budgets (other budgets keep theirs) and `tau_source:`
    in a profile YAML, keeping every other key, comment and quote (ruamel.yaml round trip).

    The edited text is validated through the profile schema before it replaces the file
    atomically (`files.write_atomic`), so a failure leaves the old file untouched.

    Raises:
        CakeError: the file does not validate as a profile before or after the edit, or the
            result does not hold the chosen taus; or it cannot be written.
    """
    parse_profile(path)  # a valid profile to begin with: `taus` is a list of {budget, tau1, tau2}
    rt = YAML()  # round trip: comments, key order, flow style and quotes are kept
    rt.preserve_quotes = True
    rt.width = 4096  # never fold a long tau_source line
    rt.indent(mapping=2, sequence=4, offset=2)
    data = rt.load(path.read_text(encoding="utf-8"))
    points = data["taus"]
    for c in sorted(chosen, key=lambda c: c.budget):
        tau1, tau2 = (float(t) for t in c.best)
        old = next((p for p in points if p["budget"] == c.budget), None)
        if old is not None:  # edited in place: a comment on that line stays
            old["tau1"], old["tau2"] = tau1, tau2
            continue
        point = CommentedMap(budget=c.budget, tau1=tau1, tau2=tau2)
        point.fa.set_flow_style()
        points.insert(sum(p["budget"] < c.budget for p in points), point)
    indicator = next((c.indicator for c in chosen if c.indicator is not None), None)
    if indicator is not None:  # a profile search: the pooling and gamma chosen with the taus
        data["pooling"]["kind"], data["pooling"]["kernel"] = indicator[0], int(indicator[1])
        data["gamma"] = float(indicator[2])
    data["tau_source"] = DoubleQuotedScalarString(source)
    out = io.StringIO()
    rt.dump(data, out)
    text = out.getvalue()
    try:
        profile = validate_profile(yaml.safe_load(text), path)
    except CakeError as exc:
        raise CakeError(f"the updated profile would not validate ({exc.message})") from None
    got = {p.budget: (p.tau1, p.tau2) for p in profile.taus}
    if any(got.get(c.budget) != tuple(float(t) for t in c.best) for c in chosen):
        raise CakeError(f"the updated profile {path} does not hold the chosen taus")
    write_atomic(path, text, "profile")
