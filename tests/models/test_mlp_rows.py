"""A long prompt's MLP in blocks of rows (`models.mlp_rows`): the same values as the class's own
forward, never more than `rows` tokens through a projection at once, on every supported family."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.generate import prefill
from cake_cli.models.loader import load_model
from cake_cli.models.mlp_rows import ROWS, bound_mlp_rows, dense_mlps
from tests.helpers.models import tiny_family, tiny_llama
from tests.helpers.tiny import save_tiny_model

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3"]


def unbounded(mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The reference: the MLP's class forward on every row at once."""
    return type(mlp).forward(mlp, x)


@pytest.mark.parametrize("arch", FAMILIES)
@pytest.mark.parametrize("tokens", [1, 7, 8, 9, 37])
def test_blocks_give_the_class_forward_on_random_rows(arch, tokens):
    model = tiny_family(arch, layers=2)
    assert bound_mlp_rows(model, rows=8) == 2
    g = torch.Generator().manual_seed(tokens)
    for mlp in dense_mlps(model):
        x = torch.randn(1, tokens, model.config.hidden_size, generator=g) * 3
        with torch.no_grad():
            got, want = mlp(x), unbounded(mlp, x)
        assert got.shape == want.shape == x.shape
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
        if tokens <= 8:  # one block: the class forward itself
            assert torch.equal(got, want)


def test_no_projection_sees_more_than_rows_tokens():
    model = tiny_llama(layers=2)
    bound_mlp_rows(model, rows=5)
    seen: list[int] = []
    mlp = dense_mlps(model)[0]
    mlp.gate_proj.register_forward_hook(lambda m, args, out: seen.append(args[0].shape[-2]))
    with torch.no_grad():
        mlp(torch.randn(1, 23, model.config.hidden_size))
    assert seen == [5, 5, 5, 5, 3]


def test_a_cake_prefill_keeps_the_same_tokens_and_logits():
    ids = torch.randint(3, 97, (1, 120), generator=torch.Generator().manual_seed(1))
    config = CakeConfig(budget=32, window=8)
    states = []
    for rows in (None, 16):
        model = tiny_llama()
        if rows:
            bound_mlp_rows(model, rows)
        use_cake_attention(model, "sdpa")
        states.append(prefill(model, ids, config))
    whole, blocks = states
    assert blocks.lengths == whole.lengths and blocks.cascade.final_budgets == whole.cascade.final_budgets
    for got, want in zip(blocks.cache.layers, whole.cache.layers):
        assert torch.equal(got.positions, want.positions)
        torch.testing.assert_close(got.keys, want.keys, atol=1e-5, rtol=0)
    torch.testing.assert_close(blocks.logits, whole.logits, atol=1e-5, rtol=0)


def test_a_deep_copy_runs_its_own_weights():
    model = tiny_llama(layers=1)
    bound_mlp_rows(model, rows=4)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        dense_mlps(twin)[0].down_proj.weight.mul_(2)
    x = torch.randn(1, 10, model.config.hidden_size)
    with torch.no_grad():
        mine, its = dense_mlps(model)[0](x), dense_mlps(twin)[0](x)
    torch.testing.assert_close(its, 2 * mine)


class Experts(nn.Module):  # a mixture-of-experts block: not a dense MLP, left alone
    def forward(self, x):
        return x, None


class Block(nn.Module):
    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.mlp = mlp


def test_only_dense_mlps_without_a_device_hook_are_bounded():
    dense = tiny_llama(layers=1).model.layers[0].mlp
    hooked = copy.deepcopy(dense)
    hooked._hf_hook = object()  # accelerate wraps this one's forward (a device map)
    model = nn.ModuleList([Block(Experts()), Block(dense), Block(hooked)])
    assert dense_mlps(model) == [dense]
    assert bound_mlp_rows(model) == 1 and dense.cake_mlp_rows == ROWS and "forward" not in vars(hooked)
    with pytest.raises(ValueError, match="at least 1"):
        bound_mlp_rows(model, rows=0)


def test_the_loader_bounds_every_layer(tmp_path, monkeypatch):
    monkeypatch.setenv("CAKE_HOME", str(tmp_path / "home"))
    loaded = load_model(str(save_tiny_model(tmp_path / "tiny", layers=3)))
    mlps = dense_mlps(loaded.model)
    assert len(mlps) == 3 and all(m.cake_mlp_rows == ROWS for m in mlps)
