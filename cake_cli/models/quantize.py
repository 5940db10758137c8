"""Quantized linear layers for CPU decoding (`--weights int8|int4|w8a8`).

A decode step multiplies one token's activations by every weight matrix of the model, so on a CPU
it is bound by how many weight bytes it reads (the default model's bf16 weights: ~1 GB per token,
its 151,936 x 896 output head alone 272 MB). Storing the weights in 8 or 4 bits and multiplying
with torch's fused CPU kernels reads 2-4x fewer bytes: measured on the project's machine (1 thread,
benchmarks/runs/decode-profile-2026-12-02.md) the default model's linear layers take 56-87 ms per
token in bf16, 25 ms in int8 and 17-21 ms in int4.

- **int8**: symmetric per output channel, ``w ≈ q · s`` with ``q`` in [-127, 127] and ``s = max|w_row| / 127``
  (``torch._weight_int8pack_mm``, the kernel torchao's CPU int8 weight-only layout calls);
- **int4**: asymmetric per group of `GROUP` input channels, ``w ≈ (q - 8) · s + z`` with ``q`` in
  [0, 15], ``s = (max - min) / 15``, ``z = min + 8 s`` (``torch._weight_int4pack_mm_for_cpu``, the
  tinygemm formula torchao's ``Int4CPULayout`` uses).

The kernels are vectorized for bf16 activations; in float32 (or float16) they fall back to a scalar
loop, slower than a float32 matrix product (on an AVX2 CPU, one 4864 x 896 layer at 1 thread: 5.5 ms
against 0.95 ms, through bf16 0.60 ms; a scratch measurement). A model computing in float32
(`--dtype auto` on a CPU without native bf16) therefore decodes through them in bf16,
`KERNEL_DTYPE`: the token's activations are rounded to bf16 on the way in and the bf16 product is
widened back, the precision a bf16 model decodes with (the README demo at 1 thread: 11.8 tok/s
against 1.4 on the float32 path, decode-path perplexity 7.186 against float32 weights' 7.180;
benchmarks/runs/avx2-kernels-bf16-2026-12-04.txt). Scales are kept in `KERNEL_DTYPE` on every path,
so prefill's dequantized weight and decode's fused product use the same weight values.

- **w8a8**: int8's weights (the same cached tensors), and the activations quantized too, dynamically
  per token (on decode and, since it is faster there too, on prefill; below), so the product runs in
  integer arithmetic (fbgemm's dynamic int8 linear, ``torch.ops.quantized.linear_dynamic``,
  per-channel weights, 7-bit unsigned activations with a per-token scale and zero point:
  ``reduce_range``, which keeps AVX2's 8-bit multiply-add from saturating). This is what llama.cpp
  does on CPUs (8-bit activations against its quantized blocks); torch's weight-only int8 kernel
  reads weights at about half the speed a CPU can stream them (module `W8A8Linear`). Layers whose
  input is the MLP's gated product (``in_features`` equal to the config's ``intermediate_size``, the
  down projection) stay weight-only int8: those activations carry the outlier channels a per-token
  scale loses precision to (LLM.int8(), SmoothQuant; on the default model their activation
  quantization alone cost 0.06 of decode-path perplexity).

Prefill multiplies many tokens at once; there the weight-only kernels measured 2-3x slower than a
bf16 matrix product (256 tokens), so for int8 and int4 a forward of more than `DECODE_ROWS` tokens
dequantizes the weight to the activation dtype and runs an ordinary ``F.linear``: prefill keeps the
speed of the model's dtype, decode reads the small weights. **w8a8's prefill stays in integer
arithmetic** (`W8A8Linear.prefill_product`): at the default model's prefill shapes fbgemm's int8
product ran at 605-660 GOP/s where float32 ran at 162-176 GFLOP/s and bf16 at 380-414 (2 threads,
AVX512-BF16 EPYC, benchmarks/runs/speed-peak-w8a8-2026-12-06.txt), and a whole CAKE prefill of 8K
tokens took 0.69x the time (benchmarks/runs/prefill-ab-2026-12-06.txt),
so on a CPU without native bf16, where `auto` picks w8a8, the prefill's linear layers are no longer
float32 products. The down projections stay int8 there as well (dequantized, for their outlier
channels). Only the decoder's and the output head's ``nn.Linear`` layers are quantized; the
embedding (a lookup, not a product) keeps its dtype.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

SCHEMES = ("bf16", "int8", "int4", "w8a8")  # bf16 = the model's own dtype, nothing quantized
GROUP = 32  # int4 input channels per scale/zero pair (the kernel takes 32, 64, 128, 256; see module doc)
KERNEL_DTYPE = torch.bfloat16  # the activation dtype the CPU kernels are vectorized for (module docstring)
DECODE_ROWS = 4  # forwards of at most this many tokens use the fused kernel (decode); more: dequantize
CLIP_STEPS = 20  # int4: ranges tried per group, from min-max down to (1 - CLIP_SHRINK) of it
CLIP_SHRINK = 0.35
FIT_ROUNDS = 2  # int4: least-squares fit / re-round alternations per tried range
FIT_ROWS = 8192  # int4: output rows fitted at a time (bounds the float32 temporaries to ~30 MB each)
STORED = {"int8": "int8", "int4": "int4", "w8a8": "int8"}  # scheme -> the scheme whose cached tensors it reads
_SAVED = {"int8": (".qweight", ".scales"), "int4": (".nibbles", ".scale_zero")}
PARTS = {scheme: _SAVED[stored] for scheme, stored in STORED.items()}  # saved tensors per layer format
FINGERPRINTED = (".qweight", ".scales", ".nibbles", ".scale_zero", ".qweight_ends")  # sampled buffers
ENDS = 16  # W8A8Linear keeps this many int8 codes from each end of its weight; fingerprint.SAMPLES is this


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8 quantization.

    Args:
        weight: [N, K] float weight (N output, K input channels).

    Returns:
        (q [N, K] int8 in [-127, 127], scales [N] float32) with weight ≈ q · scales[:, None].
    """
    w = weight.float()
    scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)  # [N]
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


def quantize_int4(
    weight: torch.Tensor, group: int = GROUP, importance: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric int4 quantization per group of `group` input channels, each group's scale and
    zero fitted to its weights (tinygemm's formula ``w ≈ (q - 8) · s + z``).

    Min-max scaling spends the 16 levels on the two extreme weights of a group; here each group tries
    `CLIP_STEPS` ranges shrunk from its min-max range (by up to `CLIP_SHRINK`), and from each
    alternates a weighted least-squares fit of (scale, offset) to the codes with re-rounding the
    codes (`FIT_ROUNDS` times), keeping the range with the least weighted squared error
    ``sum_k a_k (w_k - ŵ_k)^2`` (the min-max start is one candidate and neither step can raise the
    error, so the fit is never worse than min-max). The weights `a_k` are the input channels'
    importance (mean squared activation on a calibration text, `models.calibration`; llama.cpp's
    "importance matrix" idea), so the error is spent where the activations are small.

    Args:
        weight: [N, K] float weight, K divisible by `group`.
        importance: [K] non-negative weight per input channel, or None (all 1).

    Returns:
        (nibbles [N, K // 2] uint8: q[:, 2j] in the low and q[:, 2j + 1] in the high 4 bits,
        scale_zero [K // group, N, 2] float32: (s, z) with weight ≈ (q - 8) · s + z per group).

    Raises:
        ValueError: K not divisible by `group`, `group` odd, or `importance` not [K].
    """
    n, k = weight.shape
    if k % group or group % 2:
        raise ValueError(f"int4 needs the input size ({k}) to be a multiple of the group size ({group})")
    if importance is not None and tuple(importance.shape) != (k,):
        raise ValueError(f"importance must have one value per input channel ({k}), got {tuple(importance.shape)}")
    parts = [_fit_rows(weight[i : i + FIT_ROWS], group, importance) for i in range(0, n, FIT_ROWS)]
    q = torch.cat([p[0] for p in parts])  # [N, K] uint8 in [0, 15]
    scale, low = torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts])  # [N, G]
    nibbles = q[:, 0::2] | (q[:, 1::2] << 4)  # [N, K/2]
    scale_zero = torch.stack([scale, low + 8 * scale], dim=-1).transpose(0, 1).contiguous()  # [G, N, 2]
    return nibbles, scale_zero


def _fit_rows(
    weight: torch.Tensor, group: int, importance: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`quantize_int4`'s fit for a block of rows: (codes [n, K] uint8, scale [n, G], low [n, G])
    with weight ≈ codes · scale + low per group (float32)."""
    n, k = weight.shape
    w = weight.float().view(n, k // group, group)  # [n, G, group]
    a = torch.ones(k) if importance is None else importance.float().clamp(min=0) + 1e-12
    a = a.view(1, k // group, group)  # [1, G, group]: broadcast over rows
    a_sum = a.sum(-1)  # [1, G]
    w_mean = (a * w).sum(-1) / a_sum  # [n, G]: the weighted mean, the same for every range and round
    w_centered = w - w_mean[..., None]
    w_low, w_high = w.amin(dim=-1), w.amax(dim=-1)  # [n, G]
    best_err = best_scale = best_low = None
    for step in range(CLIP_STEPS):
        shrink = 1.0 - CLIP_SHRINK * step / CLIP_STEPS
        low = w_low * shrink
        scale = ((w_high - w_low) * shrink / 15).clamp(min=1e-12)
        q = _codes(w, scale, low)
        for _ in range(FIT_ROUNDS):
            q_mean = (a * q).sum(-1) / a_sum  # [n, G]
            dq = q - q_mean[..., None]
            var = (a * dq * dq).sum(-1)
            cov = (a * dq * w_centered).sum(-1)
            fitted = cov / var.clamp(min=1e-30)
            ok = (var > 0) & (fitted > 1e-12)  # a degenerate group (one code, or a flipped fit) keeps its range
            low = torch.where(ok, w_mean - fitted * q_mean, low)
            scale = torch.where(ok, fitted, scale)
            q = _codes(w, scale, low)
        err = (a * (q * scale[..., None] + low[..., None] - w) ** 2).sum(-1)  # [n, G]
        if best_err is None:
            best_err, best_scale, best_low = err, scale, low
        else:
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_scale = torch.where(better, scale, best_scale)
            best_low = torch.where(better, low, best_low)
    codes = _codes(w, best_scale, best_low).to(torch.uint8).view(n, k)
    return codes, best_scale, best_low


def _codes(w: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """Nearest codes in [0, 15] (float) of w [n, G, group] for w ≈ q · scale + low per group."""
    return torch.round((w - low[..., None]) / scale[..., None]).clamp(0, 15)


def unpack_int4(nibbles: torch.Tensor) -> torch.Tensor:
    """[N, K // 2] uint8 nibbles -> [N, K] int32 values in [0, 15] (inverse of the packing above)."""
    q = torch.stack([nibbles & 15, nibbles >> 4], dim=-1)  # [N, K/2, 2]
    return q.view(nibbles.shape[0], -1).to(torch.int32)


def dequantize_int4(nibbles: torch.Tensor, scale_zero: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[N, K] weight in `dtype` from `quantize_int4`'s output (the slow reference the tests use too)."""
    q = unpack_int4(nibbles).float()  # [N, K]
    n, k = q.shape
    groups = scale_zero.shape[0]
    s = scale_zero[..., 0].float().t().repeat_interleave(k // groups, dim=1)  # [N, K]
    z = scale_zero[..., 1].float().t().repeat_interleave(k // groups, dim=1)
    return ((q - 8) * s + z).to(dtype)


class QuantizedLinear(nn.Module):
    """What the quantized layers share: a forward of at most `DECODE_ROWS` tokens runs the
    layer's fused CPU kernel (`fused`) on `kernel_dtype` activations and widens the product back;
    a longer one multiplies by the weight dequantized to the input's dtype (module docstring).
    Subclasses set ``in_features``, ``out_features`` and a ``bias`` buffer ([N] in the compute
    dtype, or None) and define `dequantized` and `fused`.
    """

    kernel_dtype = KERNEL_DTYPE  # the activation dtype `fused` takes and returns

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """[N, K] weight in `dtype`."""
        raise NotImplementedError

    def fused(self, rows: torch.Tensor) -> torch.Tensor:
        """[M, K] `kernel_dtype` rows -> [M, N] `kernel_dtype` product, no bias."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., K] -> [..., N] in the input's dtype."""
        rows = x.reshape(-1, self.in_features)  # [M, K]
        if rows.shape[0] > DECODE_ROWS:
            return F.linear(x, self.dequantized(x.dtype), self.bias)
        out = self.fused(rows.to(self.kernel_dtype)).to(x.dtype)  # [M, N]
        if self.bias is not None:
            out = out + self.bias.to(x.dtype)
        return out.view(*x.shape[:-1], self.out_features)


class Int8Linear(QuantizedLinear):
    """``nn.Linear`` with int8 weights (see the module docstring).

    Buffers: ``qweight`` [N, K] int8, ``scales`` [N] in `KERNEL_DTYPE`, ``bias`` [N] (compute dtype)
    or None. Input [..., K] -> output [..., N] in the input's dtype.
    """

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype):
        super().__init__()
        self.in_features, self.out_features = qweight.shape[1], qweight.shape[0]
        self.register_buffer("qweight", qweight.contiguous())
        self.register_buffer("scales", scales.to(KERNEL_DTYPE))
        self.register_buffer("bias", None if bias is None else bias.to(dtype))

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """[N, K] weight in `dtype`."""
        return (self.qweight.to(dtype) * self.scales.to(dtype)[:, None]).to(dtype)

    def fused(self, rows: torch.Tensor) -> torch.Tensor:
        """[M, K] `KERNEL_DTYPE` rows -> [M, N] `KERNEL_DTYPE` product, no bias."""
        return torch._weight_int8pack_mm(rows, self.qweight, self.scales)


class Int4Linear(QuantizedLinear):
    """``nn.Linear`` with int4 weights in groups of `group` input channels (see the module docstring).

    Buffers: ``nibbles`` [N, K // 2] uint8 (portable: what is saved and what prefill dequantizes),
    ``packed`` (the CPU kernel's tiled layout of the same values, built at load), ``scale_zero``
    [K // group, N, 2] in `KERNEL_DTYPE`, ``bias`` [N] (compute dtype) or None. Input [..., K] ->
    output [..., N] in the input's dtype.
    """

    def __init__(
        self,
        nibbles: torch.Tensor,
        scale_zero: torch.Tensor,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        group: int = GROUP,
    ):
        super().__init__()
        self.out_features, self.in_features, self.group = nibbles.shape[0], nibbles.shape[1] * 2, group
        self.register_buffer("nibbles", nibbles.contiguous())
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(unpack_int4(nibbles), 1))
        self.register_buffer("scale_zero", scale_zero.to(KERNEL_DTYPE).contiguous())
        self.register_buffer("bias", None if bias is None else bias.to(dtype))

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """[N, K] weight in `dtype`."""
        return dequantize_int4(self.nibbles, self.scale_zero, dtype)

    def fused(self, rows: torch.Tensor) -> torch.Tensor:
        """[M, K] `KERNEL_DTYPE` rows -> [M, N] `KERNEL_DTYPE` product, no bias."""
        return torch._weight_int4pack_mm_for_cpu(rows, self.packed, self.group, self.scale_zero)


class W8A8Linear(QuantizedLinear):
    """``nn.Linear`` with int8 weights whose decode product quantizes the token's activations too
    (``w8a8`` in the module docstring): fbgemm's dynamic int8 linear on float32 activations, each
    row quantized to 7-bit unsigned codes with its own scale and zero point, accumulated in int32 and
    rescaled by the row's and the output channel's scales.

    The weight is held once, in fbgemm's packed layout (``packed``, built at load from int8's codes
    and scales); prefill runs the same integer product, each row quantized over its own range
    (`prefill_product`), unless ``int8_prefill`` is off, when it dequantizes the weight to the values
    `Int8Linear` dequantizes.
    Buffers: ``scales`` [N] in `KERNEL_DTYPE` (int8's), ``qweight_ends`` [2 · ENDS] int8 (the first
    and last codes of the weight, so the model's fingerprint tells it from other formats), ``bias``
    [N] (compute dtype) or None. Input [..., K] -> output [..., N] in the input's dtype.

    Raises:
        RuntimeError: this torch build has no fbgemm quantized engine (`w8a8_available`).
    """

    kernel_dtype = torch.float32  # fbgemm quantizes float32 activations itself

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype):
        super().__init__()
        if not w8a8_available():
            raise RuntimeError("w8a8 needs torch's fbgemm quantized engine, absent from this torch build")
        self.out_features, self.in_features = qweight.shape
        scales = scales.to(KERNEL_DTYPE)  # int8's scale values, so prefill matches `Int8Linear` exactly
        flat = qweight.reshape(-1)
        self.register_buffer("scales", scales)
        self.register_buffer("qweight_ends", torch.cat([flat[:ENDS], flat[-ENDS:]]))
        self.register_buffer("bias", None if bias is None else bias.to(dtype))
        with warnings.catch_warnings():  # torch marks quantized tensors deprecated; the pinned 2.13 has them
            warnings.simplefilter("ignore")
            codes = torch._make_per_channel_quantized_tensor(
                qweight.contiguous(), scales.double(), torch.zeros(self.out_features, dtype=torch.long), 0
            )
            self.packed = torch.ops.quantized.linear_prepack(codes, None)
        # [1, N] float32: sum over the input channels of the dequantized weight (`prefill_product`)
        self.row_sums = (qweight.sum(dim=1, dtype=torch.int64).double() * scales.double()).float()[None]

    int8_prefill = True  # False: prefill multiplies the dequantized weight (int8's path; benchmarks' A/B)

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        """[N, K] weight in `dtype` (codes times scales, exact in float32)."""
        return torch.ops.quantized.linear_unpack(self.packed)[0].dequantize().to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., K] -> [..., N] in the input's dtype: every forward in integer arithmetic (`fused` for
        decode, `prefill_product` for more than `DECODE_ROWS` tokens) unless `int8_prefill` is off."""
        rows = x.reshape(-1, self.in_features)  # [M, K]
        if not self.integer_prefill(rows.shape[0]):
            return super().forward(x)
        out = self.prefill_product(rows.float())
        if self.bias is not None:
            out = out + self.bias.float()
        return out.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def integer_prefill(self, rows: int) -> bool:
        """Whether a forward of `rows` tokens runs `prefill_product`: more than `DECODE_ROWS` of them
        (fewer decode through `fused`) and `int8_prefill` on."""
        return rows > DECODE_ROWS and self.int8_prefill

    def prefill_product(self, rows: torch.Tensor) -> torch.Tensor:
        """[M, K] float32 rows -> [M, N] float32 product, no bias, each row quantized over its own range.

        fbgemm's dynamic linear takes one range for its whole input, so a prompt's rows go in affinely
        rescaled: row m becomes u_m = (x_m - c_m) / r_m with c_m the midpoint and r_m the half-width of
        its range, so every row spans [-1, 1] and the shared 7-bit step 2 / 127 is, in row m's units,
        2 r_m / 127: its own range split into 127 steps, as decode's one-row call quantizes it (decode
        widens the range to hold 0; this does not need to). Then x_m W^T = r_m (u_m W^T) + c_m (1 W^T):
        the product is rescaled by r_m and the row sums of the dequantized weight, kept in float32,
        add the midpoint back. Each activation is within r_m / 127 of its code's value, so output n is
        within (r_m / 127) · sum_k |W[n, k]| of the float product (`tests/models/test_quantize.py`).
        """
        low, high = rows.aminmax(dim=1, keepdim=True)  # [M, 1] each
        mid = (high + low) / 2
        half = ((high - low) / 2).clamp(min=torch.finfo(torch.float32).tiny)
        unit = (rows - mid).div_(half)  # [M, K], every row in [-1, 1]
        out = torch.ops.quantized.linear_dynamic(unit, self.packed, True)  # [M, N]
        return out.mul_(half).addcmul_(mid, self.row_sums)  # in place: + c_m · sum_k W[n, k]

    def fused(self, rows: torch.Tensor) -> torch.Tensor:
        """[M, K] float32 rows -> [M, N] float32 product, no bias (each row quantized on its own)."""
        if rows.shape[0] == 1:
            return torch.ops.quantized.linear_dynamic(rows, self.packed, True)
        # fbgemm takes one scale for the whole input: rows one at a time keep the per-token scale
        return torch.cat([torch.ops.quantized.linear_dynamic(r, self.packed, True) for r in rows.split(1)])


def w8a8_available() -> bool:
    """Whether this torch build has the fbgemm engine `W8A8Linear` runs on (x86 CPU builds do)."""
    return "fbgemm" in torch.backends.quantized.supported_engines


def fits_int4(out_features: int, in_features: int) -> bool:
    """Whether int4's kernel takes a linear layer of that size: the output size a multiple of 16
    and the input size a multiple of `GROUP`."""
    return out_features % 16 == 0 and in_features % GROUP == 0


def layer_formats(model: nn.Module, scheme: str) -> dict[str, str]:
    """Each ``nn.Linear`` of `model` that `scheme` replaces -> the format it takes, in module order.

    ``int8``: every linear layer. ``w8a8``: w8a8 for every linear layer but those reading the MLP's
    gated product (``in_features`` = the config's ``intermediate_size``), which stay int8 (module
    docstring). ``int4``: int4 wherever its kernel fits (`fits_int4`), int8 for the
    others and for the output head (``get_output_embeddings``): the head decides every token's
    logits, and the 4-bit GGUF files keep it in 8 bits (Q8_0 in the default model's). On the
    default model the head in int8 instead of int4 lowered the perplexity of CPython's LICENSE.txt
    from 7.56 to 7.52 (min-max scales; one scratch run, no run file) for 51 MB more read per token.

    Raises:
        ValueError: an unknown scheme.
    """
    if scheme not in SCHEMES[1:]:
        raise ValueError(f"unknown weight scheme {scheme!r}; choose one of {', '.join(SCHEMES[1:])}")
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config  # multimodal: the LM's
    gated = getattr(text, "intermediate_size", None)
    formats = {}
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            if scheme == "int4":
                small = m is not head and fits_int4(m.out_features, m.in_features)
                formats[name] = "int4" if small else "int8"
            elif scheme == "w8a8":
                formats[name] = "int8" if m.in_features == gated else "w8a8"
            else:
                formats[name] = "int8"
    return formats


def tensor_names(formats: dict[str, str]) -> set[str]:
    """The flat tensor names `quantize_tensors` writes for `layer_formats`' output."""
    return {name + part for name, fmt in formats.items() for part in PARTS[fmt]}


def quantize_tensors(
    model: nn.Module, scheme: str, importance: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """Quantize every linear layer's weight of `model` into flat tensors (what is saved), each in
    its `layer_formats` format (w8a8 layers save int8's tensors).

    Args:
        importance: {layer name: [K] input-channel importance} for the int4 fit
            (`models.calibration.input_importance`); a layer missing from it fits unweighted.

    Returns:
        {"<module>.qweight"/".scales" (int8) or ".nibbles"/".scale_zero" (int4): tensor}, float
        parts in float32.

    Raises:
        ValueError: an unknown scheme.
    """
    out: dict[str, torch.Tensor] = {}
    for name, fmt in layer_formats(model, scheme).items():
        weight = model.get_submodule(name).weight.detach()
        if fmt in ("int8", "w8a8"):
            out[f"{name}.qweight"], out[f"{name}.scales"] = quantize_int8(weight)
        else:
            weights = (importance or {}).get(name)
            out[f"{name}.nibbles"], out[f"{name}.scale_zero"] = quantize_int4(weight, importance=weights)
    return out


def apply_tensors(model: nn.Module, scheme: str, tensors: Mapping[str, torch.Tensor]) -> int:
    """Replace each linear layer of `model` by its quantized module built from `tensors`
    (`quantize_tensors`' output); the float weights are freed. Returns the number replaced.

    Raises:
        KeyError: a linear layer has no tensors in `tensors`.
        OSError: a tensor read on lookup (`tensor_files.CopiedTensors`) cannot be read.
    """
    formats = layer_formats(model, scheme)
    for name, fmt in formats.items():
        linear = model.get_submodule(name)
        dtype, bias = linear.weight.dtype, linear.bias
        if fmt == "int8":
            module = Int8Linear(tensors[f"{name}.qweight"], tensors[f"{name}.scales"], bias, dtype)
        elif fmt == "w8a8":
            module = W8A8Linear(tensors[f"{name}.qweight"], tensors[f"{name}.scales"], bias, dtype)
        else:
            module = Int4Linear(tensors[f"{name}.nibbles"], tensors[f"{name}.scale_zero"], bias, dtype)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, module)
    return len(formats)


def quantize_model(model: nn.Module, scheme: str) -> int:
    """Quantize `model`'s linear layers in place (no cache, int4 unweighted); returns how many. See
    `quantize_tensors`."""
    if scheme == "bf16":
        return 0
    return apply_tensors(model, scheme, quantize_tensors(model, scheme))
