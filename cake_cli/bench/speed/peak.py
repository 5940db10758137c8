"""`cake bench speed --peak`: the host's matrix-multiply peak at the model's own shapes, and a prefill
split into linear layers, attention and the rest, each set against that peak.

The peak of a linear layer is the best of a few repeats of one GEMM of the shape the layer ran,
[tokens, in] x [in, out] (`gemm_seconds`): float32, bfloat16 where the CPU has native bf16
(`native_bf16`), and int8 through the kernel torch ships that the project's w8a8 layers decode with
(fbgemm's dynamic int8 linear, `models.quantize.W8A8Linear`; its activations are quantized inside the
call, so that time is counted). A long prompt's MLP runs in blocks of rows (`models.mlp_rows`): the
shapes are those of the calls actually made, so the peak is measured at the block's row count.

The split (`split_prefill`) times one real prefill with forward hooks, all in the same run:

- linear: every ``nn.Linear`` and quantized linear layer (`models.quantize.QuantizedLinear`), inclusive;
- attention: every attention module (``*Attention`` with a ``layer_idx``), minus the linear layers it
  calls and minus the eviction scoring it hands to the cache (the cascade's and H2O's own timers):
  RoPE, the kernel, the cache writes;
- rest: the measured prefill minus the two (eviction scoring, masks, norms, the MLP's activation,
  embedding, Python).

So linear + attention + rest is the prefill's own measured seconds (`PrefillSplit.parts`), and
each part is a sum of disjoint intervals of it; hook overhead (two clock reads per call) falls in rest.
"""

from __future__ import annotations

import time
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from cake_cli.engine.config import CakeConfig
from cake_cli.engine.generate import prefill
from cake_cli.models.quantize import QuantizedLinear, W8A8Linear, quantize_int8, w8a8_available

PEAK_REPEATS = 3  # GEMM repeats per shape; the best is the peak
ATTENTION_KEYS = 2048  # keys of the attention peak's GEMM at most ([n, d] x [d, min(n, this)]: bounded memory)
KINDS = ("float32", "bfloat16", "int8")


def native_bf16() -> bool:
    """Whether the CPU multiplies bf16 natively (oneDNN's AVX512-BF16 / AMX check); always True on CUDA."""
    return torch.cuda.is_available() or bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def available_kinds() -> tuple[str, ...]:
    """The GEMM kinds this host measures: float32 always, bfloat16 where native, int8 where fbgemm is."""
    return tuple(
        k for k in KINDS if k == "float32" or (k == "bfloat16" and native_bf16()) or (k == "int8" and w8a8_available())
    )


def gemm_seconds(tokens: int, inner: int, outer: int, kind: str, repeats: int = PEAK_REPEATS) -> float:
    """Best wall time of `repeats` GEMMs [tokens, inner] x [inner, outer] (after one warm-up), seconds.

    `kind`: "float32" or "bfloat16" (``F.linear`` in that dtype, as a float linear layer runs), or "int8"
    (fbgemm's dynamic int8 linear on float32 activations, per-channel int8 weights: w8a8's kernel).

    Raises:
        ValueError: an unknown kind, a non-positive size, or `repeats` < 1.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown GEMM kind {kind!r}; choose one of {', '.join(KINDS)}")
    if min(tokens, inner, outer) < 1 or repeats < 1:
        raise ValueError(f"bad GEMM [{tokens}, {inner}] x [{inner}, {outer}] or repeats {repeats}")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, inner, generator=gen)  # [M, K]
    w = torch.randn(outer, inner, generator=gen)  # [N, K], as nn.Linear holds it
    if kind == "int8":
        q, scales = quantize_int8(w)
        with warnings.catch_warnings():  # torch marks quantized tensors deprecated; the pinned 2.13 has them
            warnings.simplefilter("ignore")
            codes = torch._make_per_channel_quantized_tensor(
                q.contiguous(), scales.double(), torch.zeros(outer, dtype=torch.long), 0
            )
            packed = torch.ops.quantized.linear_prepack(codes, None)

        def run():
            return torch.ops.quantized.linear_dynamic(x, packed, True)
    else:
        dtype = getattr(torch, kind)
        x, w = x.to(dtype), w.to(dtype)

        def run():
            return F.linear(x, w)

    with torch.inference_mode():
        run()
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - start)
    return best


def gemm_flops(tokens: int, inner: int, outer: int) -> int:
    """Multiply-adds x 2 of [tokens, inner] x [inner, outer]."""
    return 2 * tokens * inner * outer


def attention_flops(queries: int, keys: int, heads: int, head_dim: int) -> int:
    """FLOPs of one layer's attention products (QK^T and PV) for `queries` new tokens over `keys`
    (the last `queries` of them new, causal among themselves): 4 · H · d per (query, visible key)."""
    cached = keys - queries
    visible = queries * cached + queries * (queries + 1) // 2  # causal triangle over the new tokens
    return 4 * heads * head_dim * visible


@dataclass(frozen=True)
class PrefillSplit:
    """One prefill timed by part (module docstring). Seconds; FLOPs of the products it ran.

    `shapes` counts the linear calls by (tokens, in, out), `int8_shapes` those of them that multiplied in
    int8 (w8a8's integer prefill, `models.quantize.W8A8Linear.prefill_product`); `attention` lists
    (queries, keys) per attention call (one per layer for a prefill)."""

    tokens: int
    seconds: float  # the prefill as `engine.generate.prefill` measured it
    linear_seconds: float
    attention_seconds: float
    eviction_seconds: float  # within attention's gross time, moved to rest
    shapes: dict = field(default_factory=dict)  # (tokens, in, out) -> calls
    attention: tuple = ()  # ((queries, keys), ...)
    int8_shapes: dict = field(default_factory=dict)  # (tokens, in, out) -> calls in int8

    @property
    def rest_seconds(self) -> float:
        """The prefill minus linear and attention: eviction scoring, masks, norms, Python."""
        return self.seconds - self.linear_seconds - self.attention_seconds

    @property
    def parts(self) -> tuple[float, float, float]:
        """(linear, attention, rest) seconds; they add up to `seconds`."""
        return self.linear_seconds, self.attention_seconds, self.rest_seconds


def _is_linear(module: nn.Module) -> bool:
    return isinstance(module, (nn.Linear, QuantizedLinear))


def _is_attention(module: nn.Module) -> bool:
    return type(module).__name__.endswith("Attention") and hasattr(module, "layer_idx")


class _Timers:
    """Forward hooks that add each linear and attention call's wall time to running totals."""

    def __init__(self, model: nn.Module):
        self.linear = self.attention = self.linear_in_attention = 0.0
        self.shapes: Counter = Counter()
        self.int8_shapes: Counter = Counter()
        self.calls: list[tuple[int, int]] = []
        self._open: dict[int, float] = {}
        self._depth = 0  # attention modules open (linear time inside one is not attention's)
        self.handles = []
        for module in model.modules():
            if _is_linear(module):
                self.handles += [
                    module.register_forward_pre_hook(self._start),
                    module.register_forward_hook(self._linear_end),
                ]
            elif _is_attention(module):
                self.handles += [
                    module.register_forward_pre_hook(self._attention_start, with_kwargs=True),
                    module.register_forward_hook(self._attention_end, with_kwargs=True),
                ]

    def _start(self, module, args) -> None:
        self._open[id(module)] = time.perf_counter()

    def _linear_end(self, module, args, output) -> None:
        dt = time.perf_counter() - self._open.pop(id(module))
        self.linear += dt
        if self._depth:
            self.linear_in_attention += dt
        x = args[0]
        shape = (x.numel() // x.shape[-1], module.in_features, module.out_features)
        self.shapes[shape] += 1
        if isinstance(module, W8A8Linear) and module.integer_prefill(shape[0]):
            self.int8_shapes[shape] += 1

    def _attention_start(self, module, args, kwargs) -> None:
        self._depth += 1
        self._open[id(module)] = time.perf_counter()

    def _attention_end(self, module, args, kwargs, output) -> None:
        self.attention += time.perf_counter() - self._open.pop(id(module))
        self._depth -= 1
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        queries = hidden.shape[-2]
        self.calls.append((queries, queries))  # a prefill from an empty cache: keys = queries

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def split_prefill(model, input_ids: torch.Tensor, config: CakeConfig | None) -> PrefillSplit:
    """One `engine.generate.prefill` of `input_ids` [1, n] with `config` (None: full cache), timed by part
    (module docstring); the hooks are removed afterwards whatever happens.

    Raises:
        ValueError: as `prefill`.
    """
    timers = _Timers(model)
    try:
        state = prefill(model, input_ids, config, collect_stats=False)
    finally:
        timers.remove()
    eviction = (state.cascade.seconds if state.cascade is not None else 0.0) + state.cache.accumulate_seconds
    return PrefillSplit(
        tokens=input_ids.shape[1],
        seconds=state.seconds,
        linear_seconds=timers.linear,
        attention_seconds=timers.attention - timers.linear_in_attention - eviction,
        eviction_seconds=eviction,
        shapes=dict(timers.shapes),
        attention=tuple(timers.calls),
        int8_shapes=dict(timers.int8_shapes),
    )


@dataclass(frozen=True)
class PeakRow:
    """One prefill set against the host's peak. Seconds, GFLOP/s; fractions in 0..1 (of the peak)."""

    model: str
    dtype: str  # the dtype the linear layers multiply in (a quantized layer's prefill: its dequantized dtype;
    # w8a8's integer prefill calls are set against the int8 peak, `peak_row`)
    tokens: int
    method: str
    prefill_seconds: float
    linear_seconds: float
    attention_seconds: float
    rest_seconds: float
    eviction_seconds: float
    linear_gflops: float  # achieved: the linear calls' FLOPs / linear seconds
    linear_peak_gflops: float  # the same FLOPs / their best GEMM times at the same shapes and dtype
    attention_gflops: float
    attention_peak_gflops: float  # best GEMM rate at [n, d] x [d, min(n, ATTENTION_KEYS)]
    peaks: dict = field(default_factory=dict)  # kind -> GFLOP/s (GOP/s for int8) over the same linear calls
    threads: int = 1  # torch CPU threads of the prefill and of every GEMM of its peaks

    def to_dict(self) -> dict:
        """Every field and the three fractions of the peak (JSON and the report's table)."""
        return {
            **asdict(self),
            "linear_of_peak": self.linear_of_peak,
            "attention_of_peak": self.attention_of_peak,
            "prefill_of_peak": self.prefill_of_peak,
        }

    @property
    def linear_of_peak(self) -> float:
        return self.linear_gflops / max(self.linear_peak_gflops, 1e-12)

    @property
    def attention_of_peak(self) -> float:
        return self.attention_gflops / max(self.attention_peak_gflops, 1e-12)

    @property
    def prefill_of_peak(self) -> float:
        """The time the linear and attention FLOPs would take at their peaks, over the measured prefill."""
        ideal = self.linear_seconds * self.linear_of_peak + self.attention_seconds * self.attention_of_peak
        return ideal / max(self.prefill_seconds, 1e-12)


def peak_row(
    model, name: str, input_ids: torch.Tensor, config: CakeConfig | None, method: str, kinds=None, repeats=PEAK_REPEATS
) -> PeakRow:
    # The GEMMs run on torch's current thread count: the caller sets it to the prefill's.
    """`split_prefill`, then the peak of every linear shape it ran in every kind of `kinds` (default
    `available_kinds`) and in the model's dtype, and the attention peak, each the best of `repeats`.
    The linear layers' own peak (`PeakRow.linear_peak_gflops`) is that of the calls as they ran: in the
    model's dtype, and w8a8's integer prefill calls (`PrefillSplit.int8_shapes`) in int8.

    Raises:
        ValueError: as `prefill`, or an attention split that cannot be set against a peak (no layer attended).
    """
    split = split_prefill(model, input_ids, config)
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    own = dtype if dtype in ("float32", "bfloat16") else "float32"
    kinds = tuple(kinds or available_kinds())
    flops = sum(gemm_flops(*shape) * calls for shape, calls in split.shapes.items())

    ran_int8 = ("int8",) if split.int8_shapes else ()
    best = {
        (shape, kind): gemm_seconds(*shape, kind, repeats)
        for shape in split.shapes
        for kind in dict.fromkeys((own, *kinds, *ran_int8))
    }

    def rate(kind: str) -> float:
        seconds = sum(best[shape, kind] * calls for shape, calls in split.shapes.items())
        return flops / max(seconds, 1e-12) / 1e9

    peaks = {kind: rate(kind) for kind in dict.fromkeys((own, *kinds))}
    # the peak of the calls as they ran: w8a8's integer prefill calls at int8's, the others at the dtype's
    at_peak = sum(
        best[shape, own] * (calls - split.int8_shapes.get(shape, 0))
        + best.get((shape, "int8"), 0.0) * split.int8_shapes.get(shape, 0)
        for shape, calls in split.shapes.items()
    )
    cfg = model.config
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    if not split.attention:
        raise ValueError("no attention module ran: the prefill cannot be split")
    attn_flops = sum(attention_flops(q, k, heads, head_dim) for q, k in split.attention)
    n = split.tokens
    keys = min(n, ATTENTION_KEYS)
    attn_peak = gemm_flops(n, head_dim, keys) / gemm_seconds(n, head_dim, keys, own, repeats) / 1e9
    return PeakRow(
        model=name,
        dtype=own,
        tokens=n,
        method=method,
        prefill_seconds=split.seconds,
        linear_seconds=split.linear_seconds,
        attention_seconds=split.attention_seconds,
        rest_seconds=split.rest_seconds,
        eviction_seconds=split.eviction_seconds,
        linear_gflops=flops / max(split.linear_seconds, 1e-12) / 1e9,
        linear_peak_gflops=flops / max(at_peak, 1e-12) / 1e9,
        attention_gflops=attn_flops / max(split.attention_seconds, 1e-12) / 1e9,
        attention_peak_gflops=attn_peak,
        peaks=peaks,
        threads=torch.get_num_threads(),
    )
