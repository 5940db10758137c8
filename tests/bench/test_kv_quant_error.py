"""benchmarks/kv_quant_error.py's KVQuant schemes: the level quantizer against the file's affine one, the fitted
levels, the exact outliers and the pre-RoPE keys' rotation against the model's."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch
from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

from cake_cli.engine import kvquant

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kv_quant_error.py"
spec = importlib.util.spec_from_file_location("kv_quant_error", SCRIPT)
kv_quant_error = importlib.util.module_from_spec(spec)
sys.modules["kv_quant_error"] = kv_quant_error  # its dataclass looks its module up
spec.loader.exec_module(kv_quant_error)
Scheme, level_quant, rel = kv_quant_error.Scheme, kv_quant_error.level_quant, kv_quant_error.rel


def data(seed: int = 0) -> torch.Tensor:
    """[2, 200, 64] with channels of very different spreads (keys' outlier channels)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 200, 64, generator=g) * (torch.rand(64, generator=g) * 3 + 0.1)


def test_uniform_levels_are_the_files_affine_quantization():
    x = data()
    for bits in (2, 4):
        for dim in (-2, -1):  # keys per channel, values per token; 200 tokens: a last group of 8
            mine = level_quant(x, Scheme("u", bits), dim, 32)
            codes, scale, zero = kvquant.quantize(x, bits, dim, 32)
            file = kvquant.dequantize(codes, scale, zero, dim, 32)
            differ = (mine - file).abs() > 1e-3 * x.abs().max()
            # the same levels; only entries on a rounding edge (the scales' float16 rounding) take the next one
            assert differ.float().mean() < 0.01, (bits, dim)
            assert abs(rel(mine, x) - rel(file, x)) < 0.01 * rel(file, x)


def test_fitted_levels_lose_less_than_uniform_ones_at_the_same_bits():
    x = data(1)
    for bits in (2, 4):
        uniform = rel(level_quant(x, Scheme("u", bits), -1, 32), x)
        fitted = rel(level_quant(x, Scheme("k", bits, levels="kmeans"), -1, 32), x)
        assert fitted < uniform


def test_outliers_are_kept_exact_and_leave_the_range_of_their_group():
    x = data(2)
    x[0, 5, 3] = 80.0  # one entry far out in channel 3
    back = level_quant(x, Scheme("o", 2, outliers=0.01), -2, 32)  # per channel: 2 of 200 tokens exact
    assert back[0, 5, 3] == 80.0
    exact = (back == x).sum(dim=1)  # [2, 64] entries reproduced exactly per channel
    assert bool((exact >= 2).all())
    plain = level_quant(x, Scheme("p", 2), -2, 32)
    group = slice(0, 32)  # the outlier's group: its range no longer stretched to 80
    assert rel(back[0, group, 3], x[0, group, 3]) < rel(plain[0, group, 3], x[0, group, 3])


def test_pre_rope_keys_rotate_as_the_model_rotates_them():
    g = torch.Generator().manual_seed(3)
    k = torch.randn(1, 2, 10, 64, generator=g)
    angles = torch.rand(10, 32, generator=g) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)  # [10, 64]
    _, want = apply_rotary_pos_emb(k, k, cos[None], sin[None])
    assert torch.allclose(kv_quant_error.rope(k[0], cos, sin), want[0], atol=1e-6)


def test_the_file_ratio_counts_the_outliers():
    plain, sparse = Scheme("a", 2, sink=4), Scheme("b", 2, sink=4, outliers=0.01)
    n, d = 4096, 64
    extra = sparse.file_ratio(n, d) - plain.file_ratio(n, d)
    kept = n - 4 - 32  # quantized tokens
    assert abs(extra - 2 * round(0.01 * kept * d) * 32 / (2 * 16 * n * d)) < 1e-12
