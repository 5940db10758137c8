"""Which weight format a run decodes with (`--weights auto|bf16|int8|int4|w8a8`), and why.

`bf16` keeps the model's own dtype (``--dtype``); `int8` / `int4` quantize the linear layers
(`models.quantize`); `w8a8` is int8 whose products quantize the activations too (decode and prefill). `auto` picks, per
device:
- CUDA: the model's dtype (the fused kernels used here are CPU kernels);
- CPU, a float32 model (a CPU without native bf16) whose linear weights exceed `AUTO_MIN_BYTES`,
  torch built with fbgemm: w8a8. On an AVX2 CPU (AMD EPYC, the README demo at 1 thread, 3 rounds
  in turn, medians) it decoded 12.4 tok/s against int8's 7.9 and float32 weights' 6.2 (1.15-1.63x
  int8 round by round; benchmarks/runs/avx2-w8a8-2026-12-04.txt), and on the genre benchmark's 24
  cases at 8K it scored 83.1 at B = 128 and 96.1 at B = 1024, as bf16 did
  (benchmarks/runs/genres-qwen-8k-w8a8-vs-bf16.txt); its decode-path perplexity is ~2% above
  int8's (LICENSE.txt 7.316 vs 7.186, argparse.py 6.552 vs 6.427, first 512 tokens). Its prefill
  runs in int8 too (`quantize.W8A8Linear.prefill_product`): a CAKE prefill of 8K tokens took 0.69x the
  time of the same weights dequantized to float32 (2 threads, AVX512-BF16 EPYC, float32 model;
  benchmarks/runs/prefill-ab-2026-12-06.txt), for a prefill-path perplexity 0.9-1.5% above int8's. A bf16 model
  keeps int8: on a CPU with native bf16 (AMD EPYC Zen 5, 2 threads) a decode step took the same
  time in both (24.1 vs 24.4 ms at B = 256, 34.6 vs 35.1 ms with a full 8K cache, medians of 9
  rounds in turn; benchmarks/runs/decode-ab-int8-w8a8-zen5-2026-12-04.txt) and its prefill is
  slower in w8a8 (8K: 1.10x int8's time, the run above), so int8 stays;
- CPU, any other model whose linear weights exceed `AUTO_MIN_BYTES`: int8. Measured on the default model
  (1 thread, benchmarks/runs/decode-profile-2026-12-02.md): its linear layers take 2.3-3.5x less
  time per decoded token than in bf16, and its perplexity on the first 1,024 tokens of CPython's
  LICENSE.txt is 6.967 (bf16: 6.973). int4 is faster still (3-4.6x) but is asked for, not chosen:
  its perplexity there is 7.411 (+6.3%; fitted scales, int8 head) and on the genre benchmark it lost
  3.4 points at B = 128 (benchmarks/speed.md), re-rounding weights the GGUF kept mostly in 5 bits.
  A float32 model asking for int8 decodes through the kernels in bf16
  (`models.quantize`): on an AVX2 CPU (AMD EPYC, 1 thread, the README demo, medians of 3) 11.8
  tok/s against 7.4 for float32 weights, decode-path perplexity over LICENSE.txt's first 512
  tokens 7.186 (float32 weights: 7.180; benchmarks/runs/avx2-kernels-bf16-2026-12-04.txt);
- CPU, a smaller model (e.g. the tests' tiny ones): bf16, its weights stay in the CPU caches and
  decoding is not bound by reading them.

Light module (no torch).
"""

from __future__ import annotations

from cake_cli.errors import UsageError, did_you_mean

WEIGHTS = ("auto", "bf16", "int8", "int4", "w8a8")
AUTO_MIN_BYTES = 64 * 2**20  # linear weights below this (bytes, in the model's dtype) stay bf16 under auto


def check_weights(weights: str) -> str:
    """The canonical scheme name (``auto``, ``bf16``, ``int8``, ``int4`` or ``w8a8``).

    Raises:
        UsageError: an unknown name.
    """
    key = str(weights).strip().lower()
    if key not in WEIGHTS:
        hint = "use --weights auto, bf16, int8, int4 or w8a8"
        raise UsageError(f"unknown weight format '{weights}'{did_you_mean(key, WEIGHTS)}", hint)
    return key


def auto_weights(on_cuda: bool, linear_bytes: int, float32: bool = False, w8a8: bool = False) -> tuple[str, str]:
    """(scheme, why) for ``--weights auto`` (see the module docstring).

    Args:
        on_cuda: the model runs on CUDA (or is spread by a device map).
        linear_bytes: bytes of the model's linear-layer weights in its dtype.
        float32: the model computes in float32.
        w8a8: torch has the engine w8a8 runs on (`quantize.w8a8_available`).
    """
    if on_cuda:
        return "bf16", "auto: the model's dtype on CUDA (the int8/int4 kernels used are CPU kernels)"
    if linear_bytes < AUTO_MIN_BYTES:
        return "bf16", f"auto: {linear_bytes / 2**20:.0f} MiB of linear weights fit the CPU caches"
    if float32 and w8a8:
        return "w8a8", (
            "auto: a float32 model on CPU; int8 weights with per-token 7-bit activations decoded 1.2-1.6x "
            "int8's speed and prefill in 0.7x float32's time, genre-suite scores no lower than bf16's"
        )
    return "int8", "auto: int8 linear layers decode 1.6-3.5x faster than unquantized on CPU, perplexity within 0.1%"
