"""Which floating-point type a model runs in, and why (`--dtype`).

`auto` picks, per device:
- CUDA: the profile's dtype (the authors' fp16/bf16), else bfloat16 where the GPU has it, else float16;
- CPU: bfloat16 when the processor computes it natively (x86 AVX512-BF16 or AMX, read from the
  CPU flags), where bf16 prefill ran 3.2-3.4x faster than float32 on the project's machine
  (full-cache rows at 4K-16K tokens, benchmarks/runs/speed-2026-12-01.txt); float32 elsewhere,
  since an emulated bf16 product is slower than float32.

The engine computes the observation-window attention in float32 whatever the model dtype.
Light module (no torch).
"""

from __future__ import annotations

from pathlib import Path

from cake_cli.errors import UsageError, did_you_mean

DTYPE_NAMES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}
BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of native bfloat16 arithmetic


def check_dtype(dtype: str) -> str | None:
    """The canonical dtype name, or None for ``auto``.

    Raises:
        UsageError: an unknown name.
    """
    key = str(dtype).strip().lower()
    if key == "auto":
        return None
    if key not in DTYPE_NAMES:
        names = ("auto", "float32", "bfloat16", "float16")
        raise UsageError(f"unknown dtype '{dtype}'{did_you_mean(key, names)}", "use auto, float32, bfloat16 or float16")
    return DTYPE_NAMES[key]


def cpu_bf16_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """The native-bfloat16 flags this CPU reports (empty where unknown, e.g. not Linux)."""
    try:
        text = cpuinfo.read_text(encoding="ascii", errors="replace")
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return [f for f in BF16_FLAGS if f in flags]


def auto_dtype(on_cuda: bool, profile_dtype: str | None, cuda_bf16: bool, cpu_flags: list[str]) -> tuple[str, str]:
    """(dtype name, why) for ``--dtype auto`` (see the module docstring).

    Args:
        on_cuda: the model goes to a CUDA device.
        profile_dtype: the profile's preferred CUDA dtype, or None without a profile.
        cuda_bf16: the GPU supports bfloat16.
        cpu_flags: `cpu_bf16_flags()`.
    """
    if on_cuda:
        if profile_dtype:
            return profile_dtype, "auto: the profile's dtype on CUDA"
        return ("bfloat16", "auto: the GPU has bfloat16") if cuda_bf16 else ("float16", "auto: no bfloat16 on this GPU")
    if cpu_flags:
        return "bfloat16", f"auto: the CPU computes bfloat16 natively ({', '.join(cpu_flags)})"
    return "float32", "auto: the CPU has no native bfloat16 (AVX512-BF16 or AMX)"
