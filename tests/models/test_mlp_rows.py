"""A long prompt's MLP in blocks of rows (`models.mlp_rows`): the same values as the class's own
forward, never more than `rows` tokens through a projection at once, on every supported family."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

from cake_cli.engine.attention import use_cake_attention
from cake_cli.engine.config import CakeConfig
from cake_cli.engine.families import FAMILIES
from cake_cli.engine.generate import prefill
from cake_cli.models.loader import load_model
from cake_cli.models.mlp_rows import ROWS, block_bounds, bound_mlp_rows, dense_mlps
from cake_cli.models.quantize import DECODE_ROWS, quantize_model
from tests.helpers.models import TESTED_SCHEMES, tiny_family, tiny_llama
from tests.helpers.tiny import save_tiny_model


def unbounded(mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The reference: the MLP's class forward on every row at once."""
    return type(mlp).forward(mlp, x)


@pytest.mark.parametrize("arch", list(FAMILIES))
@pytest.mark.parametrize("tokens", [1, 7, 10, 11, 37])
def test_blocks_give_the_class_forward_on_random_rows(arch, tokens):
    model = tiny_family(arch, layers=2)
    assert bound_mlp_rows(model, rows=10) == 2, "every family's MLP class is in DENSE_MLPS"
    g = torch.Generator().manual_seed(tokens)
    for mlp in dense_mlps(model):
        x = torch.randn(1, tokens, model.config.hidden_size, generator=g) * 3
        with torch.no_grad():
            got, want = mlp(x), unbounded(mlp, x)
        assert got.shape == want.shape == x.shape
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
        if tokens <= 10:  # one block: the class forward itself
            assert torch.equal(got, want)


@pytest.mark.parametrize("scheme", TESTED_SCHEMES[1:])
@pytest.mark.parametrize("tokens", [17, 20, 33])
def test_quantized_layers_keep_their_prefill_product_in_every_block(scheme, tokens):
    """A tail of at most DECODE_ROWS tokens would take the decode kernel (other rounding): the
    near-equal blocks never leave one, so blocked quantized outputs equal the class forward's."""
    model = tiny_llama(layers=1)
    quantize_model(model, scheme)
    bound_mlp_rows(model, rows=16)
    mlp = dense_mlps(model)[0]
    x = torch.randn(2, tokens, model.config.hidden_size, generator=torch.Generator().manual_seed(tokens))
    with torch.no_grad():
        torch.testing.assert_close(mlp(x), unbounded(mlp, x), atol=1e-6, rtol=1e-6)
        flat = x[0]  # [T, D]: no batch dimension
        torch.testing.assert_close(mlp(flat), unbounded(mlp, flat), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("tokens", range(1, 80))
def test_blocks_cover_the_tokens_and_none_is_decode_sized(tokens):
    rows = 2 * DECODE_ROWS + 1
    bounds = block_bounds(tokens, rows)
    assert bounds[0][0] == 0 and bounds[-1][1] == tokens
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    sizes = [end - start for start, end in bounds]
    assert max(sizes) <= rows and max(sizes) - min(sizes) <= 1 and len(sizes) == -(-tokens // rows)
    if tokens > rows:
        assert min(sizes) > DECODE_ROWS


def test_no_projection_sees_more_than_rows_tokens():
    model = tiny_llama(layers=2)
    bound_mlp_rows(model, rows=10)
    seen: list[int] = []
    mlp = dense_mlps(model)[0]
    mlp.gate_proj.register_forward_hook(lambda m, args, out: seen.append(args[0].shape[-2]))
    with torch.no_grad():
        mlp(torch.randn(1, 23, model.config.hidden_size))
    assert seen == [8, 8, 7]
    bound_mlp_rows(model, rows=12)  # bounding again sets the new size
    seen.clear()
    with torch.no_grad():
        mlp(torch.randn(1, 23, model.config.hidden_size))
    assert seen == [12, 11]


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
        torch.testing.assert_close(got.values, want.values, atol=1e-5, rtol=0)
    torch.testing.assert_close(blocks.logits, whole.logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("duplicate", [copy.deepcopy, lambda m: pickle.loads(pickle.dumps(m))])
def test_a_copy_runs_its_own_weights_in_blocks(duplicate):
    model = tiny_llama(layers=1)
    bound_mlp_rows(model, rows=10)
    twin = duplicate(model)
    assert dense_mlps(twin)[0].forward.args[0] is dense_mlps(twin)[0]
    with torch.no_grad():
        dense_mlps(twin)[0].down_proj.weight.mul_(2)
    x = torch.randn(1, 25, model.config.hidden_size)
    with torch.no_grad():
        mine, its = dense_mlps(model)[0](x), dense_mlps(twin)[0](x)
    torch.testing.assert_close(its, 2 * mine)


class GptOssMLP(nn.Module):  # named like a dense MLP, returns (hidden, router scores): not in DENSE_MLPS
    def forward(self, x):
        return x, None


class Block(nn.Module):
    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.mlp = mlp


def test_only_dense_mlps_without_a_device_hook_are_bounded():
    dense = tiny_llama(layers=1).model.layers[0].mlp
    hooked, offloaded = copy.deepcopy(dense), copy.deepcopy(dense)
    hooked._hf_hook = object()  # accelerate wraps this one's forward (a device map)
    offloaded.gate_proj._hf_hook = object()  # an offload hook fetches this projection's weight per call
    model = nn.ModuleList([Block(GptOssMLP()), Block(dense), Block(hooked), Block(offloaded)])
    assert dense_mlps(model) == [dense]
    assert bound_mlp_rows(model) == 1 and dense.cake_mlp_rows == ROWS
    assert "forward" in vars(dense) and not {"forward"} & (vars(hooked).keys() | vars(offloaded).keys())
    with pytest.raises(ValueError, match="more than 8"):
        bound_mlp_rows(model, rows=2 * DECODE_ROWS)


def test_the_loader_bounds_every_layer(tmp_path, monkeypatch):
    monkeypatch.setenv("CAKE_HOME", str(tmp_path / "home"))
    loaded = load_model(str(save_tiny_model(tmp_path / "tiny", layers=3)))
    mlps = dense_mlps(loaded.model)
    assert len(mlps) == 3 and all(m.cake_mlp_rows == ROWS and "forward" in vars(m) for m in mlps)
