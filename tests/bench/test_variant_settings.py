"""`--methods NAME@tau:T1/T2` and `NAME@pool:KINDK` (with `@rank:L` and `@select[:L]`): one method run with
settings other than the profile's, so a profile point is compared on the real set in one prefill per question."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

import cake_cli.cli.commands.bench  # noqa: F401 - registers `cake bench` on the app
from cake_cli.bench.suites import parse_variants
from cake_cli.cli.main import app
from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.generate import prefill
from cake_cli.errors import UsageError
from tests.helpers.models import ids_of, kept_per_layer

runner = CliRunner()


def test_settings_apply_in_any_order_and_keep_the_methods_own():
    both, flipped, sized, ranked = parse_variants(
        "cake-chunk@tau:0.5/3@pool:avg5,cake-chunk@pool:avg5@tau:0.5/3,cake-chunk:20@pool:max7,cake@tau:2/1.5@rank:3"
    )
    assert (both.allocation, both.indicator, both.taus, both.pooling) == ("cake", "chunk", (0.5, 3.0), ("avg", 5))
    assert (flipped.taus, flipped.pooling, flipped.name) == (both.taus, both.pooling, "cake-chunk@pool:avg5@tau:0.5/3")
    assert (sized.chunk, sized.pooling, sized.taus) == (20, ("max", 7), None)
    assert (ranked.taus, ranked.rank_layer, ranked.indicator) == ((2.0, 1.5), 3, "cake")
    base = CakeConfig(budget=64, tau1=1.0, tau2=1.0, pool_kind="max", pool_kernel=5, chunk=10)
    config = both.config(base)
    want = replace(base, indicator="chunk", tau1=0.5, tau2=3.0, pool_kind="avg", pool_kernel=5)
    assert config == want
    assert sized.config(base) == replace(base, indicator="chunk", chunk=20, pool_kind="max", pool_kernel=7)


@pytest.mark.parametrize(
    "bad, message",
    [
        ("cake@tau:1", "two positive numbers T1/T2"),
        ("cake@tau:a/b", "two positive numbers T1/T2"),
        ("cake@tau:0/1", "two positive numbers T1/T2"),
        ("cake@tau:inf/1", "two positive numbers T1/T2"),
        ("cake@pool:avg4", "an odd kernel"),
        ("cake@pool:mean5", "an odd kernel"),
        ("cake@pool:max", "an odd kernel"),
        ("snapkv@tau:1/1", "uniform budgets read no temperatures"),
        ("snapkv@pool:avg5", "the snapkv indicator has its own pooling"),
        ("full@tau:1/1", "a method with a budget, and 'full' is not one"),
        ("cake@taus:1/1", "unknown setting '@taus:1/1'"),
        ("cake@gamma:a", "a number >= 0"),
        ("cake@gamma:-1", "a number >= 0"),
        ("cake@gamma:nan", "a number >= 0"),
        ("cake@gamma:inf", "a number >= 0"),
        ("snapkv@gamma:50", "the snapkv indicator reads no variance weight"),
    ],
)
def test_a_malformed_setting_is_refused_naming_it(bad, message):
    with pytest.raises(UsageError, match=message) as exc:
        parse_variants(bad)
    assert "@" in exc.value.hint


def test_a_gamma_setting_sets_the_variance_weight_only():
    (weighted, chunked) = parse_variants("cake@gamma:50,cake-chunk:20@gamma:0@pool:avg5")
    base = CakeConfig(budget=64, tau1=1.0, tau2=1.0)
    assert weighted.config(base) == replace(base, gamma=50.0)
    assert chunked.config(base) == replace(base, indicator="chunk", chunk=20, gamma=0.0, pool_kind="avg", pool_kernel=5)
    assert (weighted.name, weighted.taus, weighted.pooling) == ("cake@gamma:50", None, None)


def test_a_gamma_setting_keeps_what_that_weight_keeps(tiny_model):
    use_cake_attention(tiny_model, "sdpa")
    ids = ids_of(160, seed=3)
    base = CakeConfig(budget=24, window=8)
    (light,) = parse_variants("cake@gamma:0")
    kept = kept_per_layer(prefill(tiny_model, ids, light.config(base)))
    assert kept == kept_per_layer(prefill(tiny_model, ids, replace(base, gamma=0.0)))
    assert kept != kept_per_layer(prefill(tiny_model, ids, base))  # the variance term moved what was kept


def test_a_pooling_setting_keeps_what_that_pooling_keeps(tiny_model):
    use_cake_attention(tiny_model, "sdpa")
    ids = ids_of(160, seed=3)
    base = CakeConfig(budget=24, window=8, pool_kind="max", pool_kernel=5)
    (avg,) = parse_variants("cake@pool:avg3")
    pooled = kept_per_layer(prefill(tiny_model, ids, avg.config(base)))
    assert pooled == kept_per_layer(prefill(tiny_model, ids, replace(base, pool_kind="avg", pool_kernel=3)))
    assert pooled != kept_per_layer(prefill(tiny_model, ids, base))  # the setting changed what was kept
    assert all(len(head) < 160 for layer in pooled for head in layer)


def test_the_rows_of_a_tau_setting_carry_its_temperatures(cli_env):
    out = cli_env / "real.json"
    args = ["bench", "quality", "--suite", "real", "--model", "tiny-test", "--threads", "1", "--quick"]
    args += ["--documents", "python-textwrap", "--lengths", "600", "--window", "16", "--budgets", "48"]
    result = runner.invoke(app, [*args, "--methods", "cake,cake@tau:0.5/3", "--output", str(out)])
    assert result.exit_code == 0, result.stderr
    taus = {(r["method"], r["tau1"], r["tau2"]) for r in json.loads(out.read_text())["rows"]}
    assert ("cake@tau:0.5/3", 0.5, 3.0) in taus
    assert len({t for t in taus if t[0] == "cake"}) == 1 and ("cake", 0.5, 3.0) not in taus
