"""Weight-only int8/int4 linear layers against a slow dequantize-then-matmul reference, w8a8 against a
slow per-token activation quantization, a tiny model's logits under quantized weights, and the on-disk
cache (safetensors, keyed by content and scheme)."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from cake_cli.errors import CakeError, UsageError
from cake_cli.models.quantize import (
    DECODE_ROWS,
    GROUP,
    KERNEL_DTYPE,
    Int4Linear,
    Int8Linear,
    W8A8Linear,
    dequantize_int4,
    layer_formats,
    quantize_int4,
    quantize_int8,
    quantize_model,
)
from cake_cli.models.weight_cache import quantize_cached
from cake_cli.models.weights import AUTO_MIN_BYTES, auto_weights, check_weights
from tests.helpers.models import TESTED_SCHEMES, needs_fbgemm, tiny_llama
from tests.helpers.tiny import build_tiny_tokenizer


def _reference_int8(q, scales, x, bias):
    """x [M, K] @ (q · s)^T + b, every element in float64, the scales rounded to bf16 first (as kept);
    `bias` in the dtype the layer keeps it in (the model's)."""
    w = q.double() * scales.to(KERNEL_DTYPE).double()[:, None]
    return x.double() @ w.t() + bias.double()


def _reference_int4(nibbles, scale_zero, x, bias):
    """The int4 weight rebuilt element by element: w[n, k] = (q - 8) · s + z of k's group."""
    n_out, half = nibbles.shape
    k_in = 2 * half
    sz = scale_zero.to(KERNEL_DTYPE).double()  # kept in bf16
    w = torch.empty(n_out, k_in, dtype=torch.float64)
    for k in range(k_in):
        q = (nibbles[:, k // 2] >> (4 * (k % 2))) & 15  # low nibble: even k, high nibble: odd k
        g = k // (k_in // scale_zero.shape[0])
        w[:, k] = (q.double() - 8) * sz[g, :, 0] + sz[g, :, 1]
    return x.double() @ w.t() + bias.double()


def _reference_w8a8(q, scales, x, bias):
    """Per-token dynamic quantization, one row at a time in float64: the row's range widened to hold
    0, split into 127 steps (7-bit codes, fbgemm's reduce_range), zero point the code of 0, codes
    rounded and clamped to [0, 127]; then sum_k (code_k - zero) · q[n, k] · step · s[n] + b[n].

    Returns (out [M, N] float64, step [M]: each row's activation step)."""
    s_w = scales.to(KERNEL_DTYPE).double()  # kept in bf16, as int8's
    outs, steps = [], []
    for row in x.double():
        low, high = min(row.min().item(), 0.0), max(row.max().item(), 0.0)
        step = (high - low) / 127
        zero = min(max(round(-low / step), 0), 127)
        codes = torch.clamp(torch.round(row / step) + zero, 0, 127)
        outs.append(step * ((codes - zero) @ q.double().t()) * s_w)
        steps.append(step)
    return torch.stack(outs) + bias.double(), torch.tensor(steps, dtype=torch.float64)


@needs_fbgemm
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_w8a8_decode_quantizes_each_token_on_its_own(dtype, rows, seed):
    """Rows of very different ranges (x100, shifted): one scale for the whole input would miss the
    reference by ~100 activation steps; per token it agrees to float rounding."""
    g = torch.Generator().manual_seed(seed)
    weight, bias = torch.randn(48, 96, generator=g) * 0.1, torch.randn(48, generator=g)
    x = torch.randn(rows, 96, generator=g)
    if rows == 3:
        x[1] *= 100
        x[2] += 0.5
    x = x.to(dtype)
    q, s = quantize_int8(weight)
    out = W8A8Linear(q, s, bias, dtype)(x.unsqueeze(0))  # [1, M, N]
    ref, step = _reference_w8a8(q, s, x, bias.to(dtype))
    assert out.shape == (1, rows, 48) and out.dtype == dtype
    one_code = step * (q.double().abs().max() * s.to(KERNEL_DTYPE).double().max())  # [M]: one code's worth
    # bf16: the product, then the sum with the bias, each rounded to bf16 (2^-9 of values up to the
    # row's largest product, which the bias can exceed the output by)
    rounding = 0 if dtype == torch.float32 else 2**-7 * ref.abs().amax(1)
    err = (out[0].double() - ref).abs().amax(1)
    assert (err <= 0.01 * one_code + rounding).all(), (err, one_code)


@needs_fbgemm
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w8a8_prefill_off_multiplies_int8s_weight_exactly(dtype):
    """With `int8_prefill` off, prefill dequantizes the packed weight: the same values, and so the same
    KV cache, as int8's."""
    g = torch.Generator().manual_seed(4)
    weight, bias = torch.randn(40, 64, generator=g), torch.randn(40, generator=g)
    x = torch.randn(DECODE_ROWS + 5, 64, generator=g).to(dtype)
    parts = quantize_int8(weight)
    w8a8, int8 = W8A8Linear(*parts, bias, dtype), Int8Linear(*parts, bias, dtype)
    w8a8.int8_prefill = False
    assert torch.equal(w8a8.dequantized(dtype), int8.dequantized(dtype))
    assert torch.equal(w8a8(x), int8(x))


@needs_fbgemm
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_w8a8_prefill_quantizes_each_row_over_its_own_range(dtype, seed):
    """The integer prefill product against a float64 product of the dequantized weight: row m's
    activations are within half a step of their codes, the step 2 r_m / 127 over the row's own range
    (half-width r_m), so output n is within (r_m / 127) sum_k |W[n, k]|. Rows scaled x100 and shifted
    by +5 make one range for the whole input miss that bound by far (checked too), and the error is
    not zero (the activations are quantized)."""
    g = torch.Generator().manual_seed(seed)
    n_out, k_in, rows = 56, 80 + 16 * seed, DECODE_ROWS + 7
    weight, bias = torch.randn(n_out, k_in, generator=g) * 0.1, torch.randn(n_out, generator=g)
    x = torch.randn(rows, k_in, generator=g)
    x[1] *= 100
    x[2] += 5.0
    x[3] = 0.25  # a constant row: zero range, exact
    x = x.to(dtype)
    q, s = quantize_int8(weight)
    layer = W8A8Linear(q, s, bias, dtype)
    out = layer(x.unsqueeze(0))[0].double()  # [M, N]
    assert out.shape == (rows, n_out) and layer(x).dtype == dtype
    w = layer.dequantized(torch.float64)
    ref = x.double() @ w.t() + bias.to(dtype).double()
    half = (x.double().amax(1) - x.double().amin(1)) / 2  # [M]
    bound = (half / 127)[:, None] * w.abs().sum(1)[None] * 1.001  # [M, N]
    rounding = (
        1e-5 * ref.abs().amax(1, keepdim=True) if dtype == torch.float32 else 2**-7 * ref.abs().amax(1, keepdim=True)
    )
    err = (out - ref).abs()
    assert (err <= bound + rounding).all(), (err - bound).max()
    assert err[3].max() <= rounding[3].max()  # a constant row is one code: exact
    assert err.amax(1)[0] > 0  # quantized, not a float product
    shared = (x.double().amax() - x.double().amin()) / 2 / 127 * w.abs().sum(1)  # [N]: one range for all rows
    assert (shared[None] > 20 * bound[[0, 2, 4]]).all()  # what a shared range would have allowed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, DECODE_ROWS + 5])  # decode kernel, and the dequantized prefill path
@pytest.mark.parametrize("seed", [0, 1])
def test_quantized_linear_matches_dequantized_reference(dtype, rows, seed):
    g = torch.Generator().manual_seed(seed)
    n_out, k_in = 48 + 16 * seed, 2 * GROUP * (1 + seed)
    weight = torch.randn(n_out, k_in, generator=g) * 0.1
    bias = torch.randn(n_out, generator=g)
    x = torch.randn(rows, k_in, generator=g).to(dtype)
    decode = rows <= DECODE_ROWS
    # decode: the kernel reads the activations in bf16 and returns a bf16 product (one rounding, 2^-9)
    x_ref = x.to(KERNEL_DTYPE) if decode else x
    tol = 2e-2 if dtype == torch.bfloat16 else (4e-3 if decode else 1e-5)
    q, s = quantize_int8(weight)
    out8 = Int8Linear(q, s, bias, dtype)(x.unsqueeze(0))  # [1, M, N]: a 3-D input keeps its leading dims
    ref8 = _reference_int8(q, s, x_ref, bias.to(dtype))
    assert out8.shape == (1, rows, n_out) and out8.dtype == dtype
    assert torch.allclose(out8[0].double(), ref8, rtol=tol, atol=tol * ref8.abs().max().item())
    nib, sz = quantize_int4(weight)
    out4 = Int4Linear(nib, sz, bias, dtype)(x.unsqueeze(0))
    ref4 = _reference_int4(nib, sz, x_ref, bias.to(dtype))
    assert out4.shape == (1, rows, n_out) and out4.dtype == dtype
    assert torch.allclose(out4[0].double(), ref4, rtol=tol, atol=tol * ref4.abs().max().item())


@pytest.mark.parametrize("layer", ["int8", "int4"])
def test_float32_decode_runs_the_kernel_in_bf16(layer):
    """A float32 model's decode step gets exactly the bf16 product, widened, plus its float32 bias:
    the kernels' float32 path is a scalar loop (module docstring), so the layer must not take it,
    and the bias (the model's, not the kernel's) must not be rounded to bf16."""
    g = torch.Generator().manual_seed(5)
    weight, x = torch.randn(64, 4 * GROUP, generator=g), torch.randn(2, 4 * GROUP, generator=g)
    bias = torch.randn(64, generator=g) * 1e-3 + 1.0  # bf16 would round every one of these
    parts = quantize_int8(weight) if layer == "int8" else quantize_int4(weight)
    cls = Int8Linear if layer == "int8" else Int4Linear
    out32 = cls(*parts, bias, torch.float32)(x)
    out16 = cls(*parts, None, torch.bfloat16)(x.to(torch.bfloat16))
    assert out32.dtype == torch.float32 and torch.equal(out32, out16.float() + bias)


def test_int8_error_is_within_half_a_step():
    weight = torch.randn(64, 4 * GROUP, generator=torch.Generator().manual_seed(3))
    q, s = quantize_int8(weight)
    assert q.abs().max() <= 127 and (q.float() * s[:, None] - weight).abs().le(s[:, None] / 2 + 1e-6).all()


def _minmax_int4(weight, group=GROUP):
    """The plain int4 reference: each group's 16 levels span its min..max, nearest level per weight."""
    n, k = weight.shape
    w = weight.double().view(n, k // group, group)
    low, high = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    step = (high - low) / 15
    return (torch.round((w - low) / step).clamp(0, 15) * step + low).view(n, k)


def _int4_weights(weight, importance=None):
    """The fit's weights with its float32 scale and offset (the layer keeps them in bf16)."""
    nib, sz = quantize_int4(weight, importance=importance)
    return dequantize_int4(nib, sz, torch.float64)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_int4_fit_is_never_worse_than_min_max_in_its_weighted_error(seed):
    """Per group, the weighted squared error sum_k a_k (w_k - ŵ_k)^2 of the fit <= min-max's (the fit
    starts from min-max and neither of its steps can raise the error); and it is lower overall on
    heavy-tailed weights, where clipping the extremes pays."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(48, 4 * GROUP, generator=g) * torch.rand(48, 1, generator=g)
    weight[torch.rand(weight.shape, generator=g) < 0.02] *= 6  # a few outliers per group
    importance = torch.rand(4 * GROUP, generator=g) ** 3 * 10
    a = importance.double().view(1, 4, GROUP)
    ref = ((_minmax_int4(weight) - weight.double()) ** 2).view(48, 4, GROUP) * a
    fit = ((_int4_weights(weight, importance) - weight.double()) ** 2).view(48, 4, GROUP) * a
    assert (fit.sum(-1) <= ref.sum(-1) * (1 + 1e-5) + 1e-9).all()
    assert fit.sum() < 0.9 * ref.sum()


def test_int4_keeps_weights_already_on_a_4_bit_grid():
    """Weights a 4-bit file already rounded (each group q · s + m, q in 0..15, a group using both end
    codes) come back unchanged, weighted or not: the fit moves nothing that min-max has exactly."""
    g = torch.Generator().manual_seed(5)
    q = torch.randint(0, 16, (32, 4, GROUP), generator=g).float()
    q[..., 0], q[..., 1] = 0, 15
    scale = torch.rand(32, 4, 1, generator=g) * 0.05 + 0.01
    low = torch.randn(32, 4, 1, generator=g) * 0.1
    weight = (q * scale + low).view(32, 4 * GROUP)
    for importance in (None, torch.rand(4 * GROUP, generator=g)):
        assert torch.allclose(_int4_weights(weight, importance), weight.double(), atol=1e-6)


def test_int4_refuses_a_size_not_a_multiple_of_the_group():
    with pytest.raises(ValueError, match="multiple of the group size"):
        quantize_int4(torch.zeros(4, GROUP + 2))


@pytest.mark.parametrize("scheme,bound", [("int8", 0.15), ("int4", 1.0)])
def test_tiny_model_logits_stay_close_to_float(scheme, bound):
    """Bound: max |logit difference| / std(float logits) over 12 positions of a tiny random model
    with sharpened q/k (int8: 15%, int4: 100%; measured at most 7% and 63% over seeds 0-2: 4-bit groups of 32
    on 64-wide random layers; the real model's perplexity is the quality check, benchmarks/runs).
    w8a8's prefill is int8's exactly (`test_w8a8_prefill_multiplies_int8s_weight_exactly`)."""
    ids = torch.randint(0, 97, (1, 12), generator=torch.Generator().manual_seed(0))
    model = tiny_llama()
    with torch.no_grad():
        ref = model(ids).logits
        count = quantize_model(model, scheme)
        last = model(ids[:, -1:]).logits  # one row: the fused decode kernel
        out = model(ids).logits  # twelve rows: the dequantized path
    # q, k, v, o, gate, up, down per layer, + the output head (int8 under both schemes)
    assert count == 4 * 7 + 1 and isinstance(model.lm_head, Int8Linear)
    assert (out - ref).abs().max() / ref.std() < bound
    first = model.model.layers[0].self_attn.q_proj
    assert isinstance(first, Int8Linear if scheme == "int8" else Int4Linear) and last.shape == (1, 1, 97)


def test_cache_is_written_once_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("CAKE_HOME", str(tmp_path))
    tokenizer = build_tiny_tokenizer()
    path, hit, _ = quantize_cached(tiny_llama(), tokenizer, None, "int8")
    assert not hit and path.is_file() and path.parent == tmp_path / "models" / "weights"
    with safe_open(str(path), "pt") as f:
        assert f.metadata()["scheme"] == "int8" and "model.layers.0.self_attn.q_proj.qweight" in f.keys()
    again, hit, _ = quantize_cached(tiny_llama(), tokenizer, None, "int8")
    assert hit and again == path
    other, hit, _ = quantize_cached(tiny_llama(seed=1), tokenizer, None, "int8")  # other weights, other key
    assert not hit and other != path
    calibrated = tiny_llama(vocab=len(tokenizer))  # int4 runs the calibration text: its ids must be in range
    int4, hit, _ = quantize_cached(calibrated, tokenizer, None, "int4")
    assert not hit and int4 != path and int4.name.startswith("int4-")
    path.write_bytes(b"not safetensors")  # a damaged file is quantized again
    model = tiny_llama()
    _, hit, _ = quantize_cached(model, tokenizer, None, "int8")
    assert not hit and isinstance(model.lm_head, Int8Linear)


def test_a_cache_file_that_breaks_after_its_check_is_a_one_line_error(tmp_path, monkeypatch):
    """The cached tensors are read as each layer is built (`tensor_files.CopiedTensors`): a file that
    fails then is named with its fix, never a traceback."""
    from cake_cli.models import tensor_files

    monkeypatch.setenv("CAKE_HOME", str(tmp_path))
    tokenizer = build_tiny_tokenizer()
    path, _, _ = quantize_cached(tiny_llama(), tokenizer, None, "int8")

    def broken(self, name):
        raise OSError("Input/output error")

    monkeypatch.setattr(tensor_files.CopiedTensors, "__getitem__", broken)
    with pytest.raises(CakeError, match="cannot read the quantized weights in .*Input/output error") as e:
        quantize_cached(tiny_llama(), tokenizer, None, "int8")
    assert e.value.hint == f"delete {path} and run again"


def test_fingerprint_tells_the_weight_formats_apart():
    """A .cake made with int8 weights is never taken for int4's or bf16's (`models.fingerprint`)."""
    from cake_cli.models.fingerprint import fingerprint

    tokenizer = build_tiny_tokenizer()
    prints = set()
    for scheme in TESTED_SCHEMES:
        model = tiny_llama()
        quantize_model(model, scheme)
        prints.add(fingerprint(model, tokenizer))
    assert len(prints) == len(TESTED_SCHEMES)
    assert fingerprint(tiny_llama(), tokenizer) in prints  # bf16: the fingerprint as before


@needs_fbgemm
def test_w8a8_reads_int8s_cache_and_keeps_the_down_projection_int8(tmp_path, monkeypatch):
    """w8a8 is built from int8's cached tensors (one file, one quantization); the layers reading the
    MLP's gated product (in_features = intermediate_size) stay weight-only int8."""
    monkeypatch.setenv("CAKE_HOME", str(tmp_path))
    tokenizer = build_tiny_tokenizer()
    path, hit, _ = quantize_cached(tiny_llama(), tokenizer, None, "int8")
    model = tiny_llama()
    again, hit, _ = quantize_cached(model, tokenizer, None, "w8a8")
    assert hit and again == path
    layer = model.model.layers[0]
    assert isinstance(layer.mlp.down_proj, Int8Linear) and not isinstance(layer.mlp.down_proj, W8A8Linear)
    assert all(isinstance(m, W8A8Linear) for m in (layer.self_attn.q_proj, layer.mlp.up_proj, model.lm_head))
    formats = layer_formats(tiny_llama(), "w8a8")
    assert [n for n, f in formats.items() if f == "int8"] == [f"model.layers.{i}.mlp.down_proj" for i in range(4)]
    ids = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = tiny_llama()(ids).logits[0, -1]
        out = model(ids[:, :-1], use_cache=True)  # prefill: int8's weights; then one decode step
        last = model(ids[:, -1:], cache=out.past_key_values).logits[0, -1]
    assert (last - ref).abs().max() / ref.std() < 0.15  # as int8's bound in the logits test above


def test_weights_names_and_auto_rule():
    assert check_weights(" INT8 ") == "int8"
    assert check_weights("W8A8") == "w8a8"
    with pytest.raises(UsageError, match="unknown weight format 'int3'"):
        check_weights("int3")
    assert auto_weights(False, AUTO_MIN_BYTES)[0] == "int8"
    assert auto_weights(False, AUTO_MIN_BYTES - 1)[0] == "bf16"
    assert auto_weights(True, 10 * AUTO_MIN_BYTES)[0] == "bf16"
    # a float32 model on CPU takes w8a8 where torch has its engine; a bf16 one keeps int8 (module doc)
    assert auto_weights(False, AUTO_MIN_BYTES, float32=True, w8a8=True)[0] == "w8a8"
    assert auto_weights(False, AUTO_MIN_BYTES, float32=True, w8a8=False)[0] == "int8"
    assert auto_weights(False, AUTO_MIN_BYTES, float32=False, w8a8=True)[0] == "int8"
    assert auto_weights(False, AUTO_MIN_BYTES - 1, float32=True, w8a8=True)[0] == "bf16"
    assert auto_weights(True, 10 * AUTO_MIN_BYTES, float32=True, w8a8=True)[0] == "bf16"


def test_int4_takes_every_layer_its_kernel_fits_and_int8_for_the_output_head():
    model = tiny_llama(vocab=128)  # 128 outputs: the head would fit int4's kernel; it stays int8 on purpose
    formats = layer_formats(model, "int4")
    assert formats.pop("lm_head") == "int8" and len(formats) == 4 * 7 and set(formats.values()) == {"int4"}
    assert set(layer_formats(model, "int8").values()) == {"int8"}
    with pytest.raises(ValueError, match="unknown weight scheme 'int3'"):
        layer_formats(model, "int3")


def test_w8a8_without_fbgemm_is_refused_before_loading(monkeypatch):
    from cake_cli.errors import CakeError
    from cake_cli.models import loader

    monkeypatch.setattr(loader, "w8a8_available", lambda: False)
    monkeypatch.setattr(loader, "resolve_model", lambda *a: pytest.fail("the model was resolved"))
    with pytest.raises(CakeError, match="fbgemm") as e:
        loader.load_model("any-model", weights="w8a8")
    assert e.value.hint == "use --weights int8"
