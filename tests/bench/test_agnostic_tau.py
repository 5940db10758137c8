"""benchmarks/agnostic_tau.py: the temperatures recomputed on one reconstruction equal a reconstruction run at
those temperatures; with nothing evicted every row answers as the full cache; the report's needle counts."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

from cake_cli.bench.agnostic.run import DocumentRun, agnostic_document
from cake_cli.bench.quality.run import Model
from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.reconstruct import reconstruction_scores
from cake_cli.engine.replay import record
from tests.helpers.models import tiny_llama
from tests.helpers.tiny import build_tiny_tokenizer

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "agnostic_tau.py"
spec = importlib.util.spec_from_file_location("agnostic_tau", SCRIPT)
agnostic_tau = importlib.util.module_from_spec(spec)
spec.loader.exec_module(agnostic_tau)


def tiny_run(budget_config):
    tokenizer = build_tiny_tokenizer()
    lm = tiny_llama(vocab=len(tokenizer))
    use_cake_attention(lm, "sdpa")
    model = Model(lm, tokenizer, 1500, frozenset())
    return DocumentRun(model, agnostic_document(model, "eval", 0, 0.25, 1400), budget_config)


def test_taus_recomputed_on_one_reconstruction_equal_a_reconstruction_at_those_taus():
    run = tiny_run(lambda b: CakeConfig(budget=b, window=8))
    rec = record(run.model.model, torch.tensor([run.prefix]), 8, accumulate=False)
    repeat, target = run.reconstruction_ids()
    at_default = reconstruction_scores(run.model.model, rec.cache, repeat, target, CakeConfig(budget=64, window=8))
    other = CakeConfig(budget=64, window=8, tau1=0.5, tau2=4.0)
    direct = reconstruction_scores(run.model.model, rec.cache, repeat, target, other)
    moved = agnostic_tau.with_taus(at_default, 0.5, 4.0)
    assert moved.stats == direct.stats
    assert moved.stats != at_default.stats  # the temperatures move the preferences
    assert all((a is None and b is None) or bool((a == b).all()) for a, b in zip(moved.scores, direct.scores))


def test_with_nothing_evicted_every_row_answers_as_the_full_cache(tmp_path, capsys):
    run = tiny_run(lambda b: CakeConfig(budget=b, window=8, decode_policy="grow"))
    rows = agnostic_tau.run_document(run, 1.0, [(1.0, 1.0), (2.0, 1.5)], [4], lambda _: None)
    names = {r["row"] for r in rows}
    assert names == {"full", "full@4bit", *agnostic_tau.BASE_ROWS[1:], "reconstruct+cake@1,1", "reconstruct+cake@2,1.5"}
    full = {r["question"]: r["prediction"] for r in rows if r["row"] == "full"}
    for r in rows:
        if r["row"].startswith("reconstruct"):
            assert r["prediction"] == full[r["question"]], r["row"]
            assert r["file_bytes"] == next(x["file_bytes"] for x in rows if x["row"] == "full")
    four = next(r["file_bytes"] for r in rows if r["row"] == "full@4bit")
    assert four < 0.5 * next(r["file_bytes"] for r in rows if r["row"] == "full")
    path = tmp_path / "run.json"
    meta = {"split": "tune", "ratio": 1.0, "profile_taus": [2.0, 1.5]}
    path.write_text(json.dumps({"meta": meta, "rows": rows}), encoding="utf-8")
    agnostic_tau.report([path])
    out = capsys.readouterr().out
    assert "| reconstruct+cake@1,1 |" in out and "+0.0 [+0.0, +0.0]" in out


def test_needle_mixups_counts_another_needles_value():
    def row(kind, exact, prediction):
        return {"kind": kind, "exact": exact, "prediction": prediction}

    cells = {
        ("d", 1, 0): row("needle1", 1.0, "The passcode of A is 11111."),
        ("d", 1, 1): row("needle2", 0.0, "The passcode of B is 11111."),  # A's value
        ("d", 1, 2): row("needle3", 0.0, "The passcode of C is 99999."),
        ("d", 1, 3): row("qa", 0.0, "11111"),  # not a needle
    }
    assert agnostic_tau.needle_mixups(cells, {("d", 1): {"11111", "22222", "33333"}}) == "1 / 1 / 1"
