"""`write_profile_taus`: a round-trip edit of a profile's taus (comments, order and quotes kept)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from cake_cli.bench.tau_search import TauScores, write_profile_taus
from cake_cli.errors import CakeError
from cake_cli.models.profiles import parse_profile

SHIPPED = Path(__file__).resolve().parents[2] / "profiles"


def chosen(budget: int, tau1: float, tau2: float) -> TauScores:
    return TauScores(budget, {(tau1, tau2): 0.5}, (tau1, tau2), cases=3)


@pytest.fixture
def smollm2(tmp_path) -> Path:
    return Path(shutil.copy(SHIPPED / "smollm2.yaml", tmp_path / "smollm2.yaml"))


def test_only_the_tau_lines_change(smollm2):
    before = smollm2.read_text().splitlines()
    write_profile_taus(smollm2, [chosen(128, 0.5, 2.2)], 'searched "again": tune split')
    after = smollm2.read_text().splitlines()
    assert len(after) == len(before)
    changed = [(b, a) for b, a in zip(before, after) if b != a]
    assert changed == [
        ("  - {budget: 128, tau1: 2.0, tau2: 0.4}", "  - {budget: 128, tau1: 0.5, tau2: 2.2}"),
        (
            next(line for line in before if line.startswith("tau_source:")),
            'tau_source: "searched \\"again\\": tune split"',
        ),
    ]
    p = parse_profile(smollm2)
    assert [(t.budget, t.tau1, t.tau2) for t in p.taus] == [(128, 0.5, 2.2), (1024, 2.0, 1.5)]
    assert p.tau_source == 'searched "again": tune split'


def test_a_new_budget_is_inserted_in_order_and_comments_stay(tmp_path):
    f = tmp_path / "toy.yaml"
    original = (SHIPPED / "mistral.yaml").read_text().replace("name: mistral", "name: toy")
    original = original.replace(
        "  - {budget: 1024, tau1: 0.8, tau2: 0.5}", "  - {budget: 1024, tau1: 0.8, tau2: 0.5}  # the big one"
    )
    f.write_text("# header comment\n" + original)
    write_profile_taus(f, [chosen(256, 1.5, 0.4), chosen(4096, 0.2, 3.0), chosen(1024, 1.0, 1.0)], "grid")
    text = f.read_text()
    assert text.startswith("# header comment\nversion: 1\n")
    assert "taus:                    # published (tau1, tau2) per budget B (tokens per layer)\n" in text
    assert "  - {budget: 1024, tau1: 1.0, tau2: 1.0}  # the big one\n" in text
    assert "tau_rule: log-linear     # between points: linear in log2(B); outside: nearest point\n" in text
    points = [(p["budget"], p["tau1"], p["tau2"]) for p in yaml.safe_load(text)["taus"]]
    assert points == [(128, 1.0, 0.8), (256, 1.5, 0.4), (1024, 1.0, 1.0), (4096, 0.2, 3.0)]
    rest = {k: v for k, v in yaml.safe_load(text).items() if k not in ("taus", "tau_source")}
    assert rest == {k: v for k, v in yaml.safe_load(original).items() if k not in ("taus", "tau_source")}


def test_an_invalid_profile_is_refused_and_left_untouched(smollm2):
    broken = smollm2.read_text().replace("window: 32", "window: 32\ncolour: red")
    smollm2.write_text(broken)
    with pytest.raises(CakeError, match="unknown key 'colour'"):
        write_profile_taus(smollm2, [chosen(128, 0.5, 2.2)], "grid")
    assert smollm2.read_text() == broken
    assert [p.name for p in smollm2.parent.iterdir()] == ["smollm2.yaml"]  # no temporary file left


def test_a_result_that_would_not_validate_is_not_written(smollm2):
    original = smollm2.read_text()
    with pytest.raises(CakeError, match="would not validate"):
        write_profile_taus(smollm2, [chosen(128, -1.0, 2.2)], "grid")
    assert smollm2.read_text() == original
    assert [p.name for p in smollm2.parent.iterdir()] == ["smollm2.yaml"]
