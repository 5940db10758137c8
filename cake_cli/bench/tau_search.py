"""`cake bench tau-search`: grid search of CAKE's temperatures (tau1, tau2) for one model.

The paper tunes tau1 in 0.2-2 and tau2 in 0.4-3 by grid search (Appendix, implementation
details). We score every pair of the grid with the quality benchmark's cases of the `tune`
split (disjoint from `eval`: other haystack text, other invented facts, other SQuAD articles and
HotpotQA items; see `datasets` and `needles`), at each budget separately (a profile holds one
point per budget), and keep the best pair per budget. One recorded prefill per case serves all
pairs; pairs whose allocations keep the same tokens share one decode.

Choice: highest weighted score (`scoring.TASK_WEIGHTS`); ties go to the higher score summed over
all budgets searched, then to the pair nearest (1, 1) in log space (the authors' fallback).
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from cake_cli.bench.scoring import weighted_overall
from cake_cli.bench.suites import Variant
from cake_cli.errors import CakeError
from cake_cli.files import write_atomic
from cake_cli.models.profiles import parse_profile, validate_profile

TAU1_GRID = (0.2, 0.5, 1.0, 1.5, 2.0)  # paper range 0.2-2
TAU2_GRID = (0.4, 0.8, 1.5, 2.2, 3.0)  # paper range 0.4-3
TAU_BUDGETS = (128, 1024)  # the budgets the authors publish taus for


def variant_name(tau1: float, tau2: float) -> str:
    """The method name of one grid point in the results file, e.g. "cake@0.5,2.2"."""
    return f"cake@{tau1:g},{tau2:g}"


def tau_variants(tau1s=TAU1_GRID, tau2s=TAU2_GRID) -> list[Variant]:
    """CAKE (allocation and indicator) at every (tau1, tau2) of the grid."""
    return [Variant(variant_name(t1, t2), "cake", "cake", (t1, t2)) for t1 in tau1s for t2 in tau2s]


@dataclass(frozen=True)
class TauScores:
    """Weighted tune-split score of every grid pair at one budget, and the pair chosen."""

    budget: int
    scores: dict  # (tau1, tau2) -> weighted score in [0, 1]
    best: tuple[float, float]
    cases: int  # rows behind each pair's score

    def to_json(self) -> dict:
        return {
            "budget": self.budget,
            "best": {"tau1": self.best[0], "tau2": self.best[1], "score": self.scores[self.best]},
            "cases": self.cases,
            "grid": [{"tau1": t1, "tau2": t2, "score": s} for (t1, t2), s in sorted(self.scores.items())],
        }


def _pair(method: str) -> tuple[float, float] | None:
    m = re.fullmatch(r"cake@([0-9.]+),([0-9.]+)", method)
    return (float(m.group(1)), float(m.group(2))) if m else None


def choose(rows: list[dict], budgets=TAU_BUDGETS) -> list[TauScores]:
    """Score each (tau1, tau2) per budget from results rows and pick the best (module docstring).

    Raises:
        ValueError: no grid rows for a budget.
    """
    by: dict = {}
    for r in rows:
        pair = _pair(r["method"])
        if pair is not None and r["budget"] in budgets:
            by.setdefault((r["budget"], pair), {}).setdefault(r["task"], []).append(r["score"])
    weighted = {k: weighted_overall({t: sum(v) / len(v) for t, v in tasks.items()}) for k, tasks in by.items()}
    total: dict = {}
    for (_, pair), s in weighted.items():
        total[pair] = total.get(pair, 0.0) + s
    out = []
    for b in budgets:
        scores = {pair: s for (bb, pair), s in weighted.items() if bb == b}
        if not scores:
            raise ValueError(f"no tau-search results at budget {b}")

        def rank(pair, scores=scores, total=total):
            return (round(scores[pair], 9), round(total[pair], 9), -(math.log(pair[0]) ** 2 + math.log(pair[1]) ** 2))

        best = max(scores, key=rank)
        cases = sum(len(v) for v in by[(b, best)].values())
        out.append(TauScores(b, scores, best, cases))
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
