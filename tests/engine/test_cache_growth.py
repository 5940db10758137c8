"""Decode appends land in spare capacity (no per-step concatenation): the layer must still hold exactly
what concatenating every token would, through buffer growth, an eviction and a released slot."""

from __future__ import annotations

import torch

from cake_cli.engine.cache import GROW, CakeLayer


def test_appends_equal_concatenation_through_growth_and_eviction():
    g = torch.Generator().manual_seed(0)
    layer = CakeLayer()
    prompt_k, prompt_v = torch.randn(1, 2, 5, 4, generator=g), torch.randn(1, 2, 5, 4, generator=g)
    layer.update(prompt_k, prompt_v)
    ref_k, ref_v = [prompt_k], [prompt_v]
    for step in range(GROW + 40):  # crosses the first buffer's end
        k, v = torch.randn(1, 2, 1, 4, generator=g), torch.randn(1, 2, 1, 4, generator=g)
        keys, values = layer.update(k, v)
        ref_k.append(k)
        ref_v.append(v)
        if step == 100:  # an eviction mid-way: keep every other slot, then appending continues
            index = torch.arange(0, keys.shape[-2], 2).expand(2, -1)
            layer.keep(index)
            ref_k, ref_v = [torch.cat(ref_k, dim=2)[:, :, ::2]], [torch.cat(ref_v, dim=2)[:, :, ::2]]
            keys, values = layer.keys, layer.values
        torch.testing.assert_close(keys, torch.cat(ref_k, dim=2), atol=0, rtol=0)
        torch.testing.assert_close(values, torch.cat(ref_v, dim=2), atol=0, rtol=0)
    assert layer.nbytes() == 2 * keys.numel() * 4  # the live slots, K and V in float32
    assert layer.positions.shape == (2, keys.shape[-2]) and layer.seen == 5 + GROW + 40
    layer.release(torch.tensor([0, 1]))  # the fixed policy's slot reuse writes into the same views
    k = torch.ones(1, 2, 1, 4)
    keys, _ = layer.update(k, k)
    assert keys[0, 0, 0].eq(1).all() and keys[0, 1, 1].eq(1).all()
