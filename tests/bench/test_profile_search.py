"""The profile search (tau1 x tau2 x pooling x kernel x gamma): grid names, the variant's settings,
the choice by the held-out genres, and the profile it writes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from cake_cli.bench.scoring import GENRE_WEIGHTS
from cake_cli.bench.tau_search import choose, parse_point, profile_variants, variant_name, write_profile_taus
from cake_cli.engine.config import CakeConfig

PROFILES = Path(__file__).resolve().parents[2] / "profiles"


def test_names_round_trip_and_variants_apply_their_settings():
    assert variant_name(0.5, 2.2) == "cake@0.5,2.2" and parse_point("cake@0.5,2.2") == (0.5, 2.2, None, None, None)
    name = variant_name(0.5, 2.2, ("max", 7), 150.0)
    assert name == "cake@0.5,2.2/max7/g150" and parse_point(name) == (0.5, 2.2, "max", 7, 150.0)
    assert parse_point("snapkv") is None and parse_point("cake+snapkv") is None
    grid = profile_variants([1.0, 2.0], [0.4], [("avg", 3), ("max", 7)], [100.0, 200.0])
    assert len(grid) == 2 * 1 * 2 * 2 and len({v.name for v in grid}) == len(grid)
    v = next(v for v in grid if v.name == "cake@2,0.4/max7/g100")
    config = v.config(CakeConfig(budget=128, window=8))
    assert (config.tau1, config.tau2, config.pool_kind, config.pool_kernel, config.gamma) == (2.0, 0.4, "max", 7, 100.0)
    assert (config.allocation, config.indicator) == ("cake", "cake")


def rows_for(scores: dict) -> list[dict]:
    """Rows of one s-rt case per genre: scores[(method, genre)] at budget 128."""
    return [
        {"task": "s-rt", "case_id": f"{g}/d50-n0", "length": 2048, "method": m, "budget": 128, "score": s, "genre": g}
        for (m, g), s in scores.items()
    ]


def test_the_setting_is_chosen_on_the_held_out_genres():
    avg, mx = "cake@1,1/avg5/g200", "cake@1,1/max7/g200"
    avg2 = "cake@2,1/avg5/g200"
    rows = rows_for(
        {
            (avg, "essays"): 1.0,
            (avg, "code"): 0.2,
            (avg2, "essays"): 0.9,
            (avg2, "code"): 0.4,
            (mx, "essays"): 0.3,
            (mx, "code"): 0.6,
            ("snapkv", "code"): 1.0,  # not a grid point: ignored
        }
    )
    held = choose(rows, [128], GENRE_WEIGHTS, lambda r: r["genre"] == "code")
    (c,) = held
    assert c.indicator == ("max", 7, 200.0) and c.best == (1.0, 1.0)
    assert c.points[(1.0, 1.0, "max", 7, 200.0)] == pytest.approx((0.6, 0.3))  # (chosen-on, other) scores
    assert c.points[(2.0, 1.0, "avg", 5, 200.0)] == pytest.approx((0.4, 0.9))
    assert c.to_json()["best"] == {
        "tau1": 1.0,
        "tau2": 1.0,
        "score": 0.6,
        "pooling": "max",
        "kernel": 7,
        "gamma": 200.0,
    }
    (tuned,) = choose(rows, [128], GENRE_WEIGHTS, lambda r: r["genre"] == "essays")
    assert tuned.indicator == ("avg", 5, 200.0) and tuned.best == (1.0, 1.0)
    under = choose(rows_for({(avg2, "code"): 0.4, (avg, "code"): 0.2}), [128], GENRE_WEIGHTS, None)
    assert under[0].best == (2.0, 1.0)  # the best taus under the chosen setting


def test_a_tie_keeps_the_profile_s_own_setting():
    rows = rows_for({("cake@1,1/avg5/g200", "code"): 0.5, ("cake@1,1/max7/g200", "code"): 0.5})
    (kept,) = choose(rows, [128], GENRE_WEIGHTS, None, ("avg", 5, 200.0))
    assert kept.indicator == ("avg", 5, 200.0)
    (other,) = choose(rows, [128], GENRE_WEIGHTS, None, ("max", 7, 200.0))
    assert other.indicator == ("max", 7, 200.0)
    rows += rows_for({("cake@1,1/max7/g200", "essays"): 0.9, ("cake@1,1/avg5/g200", "essays"): 0.1})
    (by_other,) = choose(rows, [128], GENRE_WEIGHTS, lambda r: r["genre"] == "code", ("avg", 5, 200.0))
    assert by_other.indicator == ("max", 7, 200.0)  # a tie on the held-out genres goes to the better on the others


def test_the_setting_is_shared_across_budgets():
    """One pooling / gamma per profile: the setting with the highest score summed over the budgets."""
    rows = []
    for budget, (a, m) in {128: (0.5, 0.6), 1024: (0.9, 0.7)}.items():
        for method, s in (("cake@1,1/avg5/g200", a), ("cake@1,1/max7/g200", m)):
            rows.append({"task": "s-rt", "case_id": "code/d50-n0", "length": 2048, "method": method, "budget": budget,
                         "score": s, "genre": "code"})  # fmt: skip
    chosen = choose(rows, [128, 1024], GENRE_WEIGHTS)
    assert [c.indicator for c in chosen] == [("avg", 5, 200.0)] * 2  # 1.4 > 1.3 although max wins at 128
    with pytest.raises(ValueError, match="no tau-search results"):
        choose(rows, [256], GENRE_WEIGHTS)


def test_the_profile_gets_the_pooling_and_gamma(tmp_path):
    path = tmp_path / "smollm2.yaml"
    shutil.copy(PROFILES / "smollm2.yaml", path)
    rows = rows_for({("cake@2,0.4/max3/g150", "code"): 1.0, ("cake@1,1/avg5/g200", "code"): 0.5})
    write_profile_taus(path, choose(rows, [128], GENRE_WEIGHTS), "a profile search")
    data = yaml.safe_load(path.read_text())
    assert data["pooling"] == {"kind": "max", "kernel": 3} and data["gamma"] == 150.0
    assert {p["budget"]: (p["tau1"], p["tau2"]) for p in data["taus"]}[128] == (2.0, 0.4)
    assert data["tau_source"] == "a profile search"
    before = (PROFILES / "smollm2.yaml").read_text().splitlines()
    after = path.read_text().splitlines()
    changed = [a for a, b in zip(after, before) if a != b]
    assert len(after) == len(before) and all(k in " ".join(changed) for k in ("gamma", "pooling", "tau"))
