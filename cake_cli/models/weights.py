"""Which weight format a run decodes with (`--weights auto|bf16|int8|int4`), and why.

`bf16` keeps the model's own dtype (``--dtype``); `int8` / `int4` quantize the linear layers
(`models.quantize`). `auto` picks, per device:
- CUDA: the model's dtype (the fused kernels used here are CPU kernels);
- CPU, a model whose linear weights exceed `AUTO_MIN_BYTES`: int8. Measured on the default model
  (1 thread, benchmarks/runs/decode-profile-2026-12-02.md): its linear layers take 2.3-3.5x less
  time per decoded token than in bf16, and its perplexity on the first 1,024 tokens of CPython's
  LICENSE.txt is 6.967 (bf16: 6.973). int4 is faster still (3-4.6x) but is asked for, not chosen:
  its perplexity there is 7.411 (+6.3%; fitted scales, int8 head) and on the genre benchmark it lost
  3.4 points at B = 128 (benchmarks/speed.md), re-rounding weights the GGUF kept mostly in 5 bits.
  A float32 model (a CPU without native bf16) decodes int8 through the kernels in bf16
  (`models.quantize`): on an AVX2 CPU (AMD EPYC, 1 thread, the README demo, medians of 3) 11.8
  tok/s against 7.4 for float32 weights, decode-path perplexity over LICENSE.txt's first 512
  tokens 7.186 (float32 weights: 7.180; benchmarks/runs/avx2-kernels-bf16-2026-12-04.txt);
- CPU, a smaller model (e.g. the tests' tiny ones): bf16, its weights stay in the CPU caches and
  decoding is not bound by reading them.

Light module (no torch).
"""

from __future__ import annotations

from cake_cli.errors import UsageError

WEIGHTS = ("auto", "bf16", "int8", "int4")
AUTO_MIN_BYTES = 64 * 2**20  # linear weights below this (bytes, in the model's dtype) stay bf16 under auto


def check_weights(weights: str) -> str:
    """The canonical scheme name (``auto``, ``bf16``, ``int8`` or ``int4``).

    Raises:
        UsageError: an unknown name.
    """
    key = str(weights).strip().lower()
    if key not in WEIGHTS:
        raise UsageError(f"unknown weight format '{weights}'", "use --weights auto, bf16, int8 or int4")
    return key


def auto_weights(on_cuda: bool, linear_bytes: int) -> tuple[str, str]:
    """(scheme, why) for ``--weights auto`` (see the module docstring).

    Args:
        on_cuda: the model runs on CUDA (or is spread by a device map).
        linear_bytes: bytes of the model's linear-layer weights in its dtype.
    """
    if on_cuda:
        return "bf16", "auto: the model's dtype on CUDA (the int8/int4 kernels used are CPU kernels)"
    if linear_bytes < AUTO_MIN_BYTES:
        return "bf16", f"auto: {linear_bytes / 2**20:.0f} MiB of linear weights fit the CPU caches"
    return "int8", "auto: int8 linear layers decode 1.6-3.5x faster than unquantized on CPU, perplexity within 0.1%"
