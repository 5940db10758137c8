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


def _reference_write(keys, values, positions, free, k, v, seen):
    """The released-slot write done one head at a time (the obviously-correct path)."""
    keys, values, positions = keys.clone(), values.clone(), positions.clone()
    for h, slot in enumerate(free.tolist()):
        keys[0, h, slot], values[0, h, slot], positions[h, slot] = k[0, h, 0], v[0, h, 0], seen
    return keys, values, positions


def test_a_released_slot_takes_the_token_in_every_layout():
    """The new token lands in slot free[h] of head h, nothing else changes, whether the layer is contiguous
    (after an evicting prefill), a view of its decode buffer (heads a buffer's length apart) or a layout
    whose rows are not evenly spaced (the indexed-write fallback)."""
    g = torch.Generator().manual_seed(1)
    heads, dim = 3, 4
    for layout in ("contiguous", "buffer view", "uneven"):
        layer = CakeLayer()
        layer.update(torch.randn(1, heads, 9, dim, generator=g), torch.randn(1, heads, 9, dim, generator=g))
        if layout == "buffer view":
            layer.update(torch.randn(1, heads, 1, dim, generator=g), torch.randn(1, heads, 1, dim, generator=g))
            assert not layer.keys.is_contiguous()  # [1, H_kv, 10, d] of a longer buffer
        if layout == "uneven":  # every other value of a wider tensor: rows are not d apart
            wide = torch.randn(1, heads, 9, 2 * dim, generator=g)
            layer.keys, layer.values = wide[..., ::2], wide[..., 1::2]
        for step in range(3):
            free = torch.randint(0, layer.keys.shape[2], (heads,), generator=g)
            k, v = torch.randn(1, heads, 1, dim, generator=g), torch.randn(1, heads, 1, dim, generator=g)
            want = _reference_write(layer.keys, layer.values, layer.positions, free, k, v, layer.seen)
            layer.release(free)
            keys, values = layer.update(k, v)
            assert torch.equal(keys, want[0]) and torch.equal(values, want[1]), (layout, step)
            assert torch.equal(layer.positions, want[2]) and layer.slot_written == layer.seen


def test_heads_that_share_memory_take_the_indexed_write():
    """Keys expanded over heads (one row serving every head) are not written as rows: the indexed write
    refuses such memory instead of writing one head's token over another's."""
    from cake_cli.engine.cache import _as_rows

    one = torch.randn(1, 1, 5, 4)
    assert _as_rows(one.expand(1, 3, 5, 4)) is None
    assert _as_rows(torch.randn(1, 3, 5, 4))[1] == 5
