"""The CAKE method as a library: torch and transformers only (never typer, rich or other cake_cli packages).

Public API (loaded lazily, so `import cake_cli.engine.methods` stays free of torch):

- settings: `CakeConfig`, `SamplingConfig`, `ConfigError`
- switching a model: `use_cake_attention`, `default_backend`, `BACKENDS`; the family contract
  `FAMILIES`, `check_model`, `attention_layout` (local sliding layers, limits), `UnsupportedModelError`
- running: `prefill`, `decode`, `generate` -> `GenerationResult`; `record` / `replay` for grids
- a compressed prefix continued many times: `extend`, `continue_and_decode`; the cache as flat
  tensors for a file: `cache_tensors`, `cache_from_tensors` (16, 8, 4 or 2 bits, `KV_BITS`), and
  `requantized`, `quantized_in_memory` (module `cachefile`; held quantized: `QuantLayer`, module
  `kvmemory`); question-agnostic compression by reconstruction:
  `compress_by_reconstruction`, `reconstruction_scores` (module `reconstruct`)
- registries: `METHODS` (with `resolve`, `with_method`), `ALLOCATIONS`, `INDICATORS`
- the cache: `CakeCache`, `NonFiniteError`
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "CakeConfig": "config",
    "SamplingConfig": "config",
    "ConfigError": "config",
    "use_cake_attention": "attention",
    "default_backend": "attention",
    "BACKENDS": "attention",
    "FAMILIES": "families",
    "check_model": "families",
    "attention_layout": "families",
    "AttentionLayout": "families",
    "UnsupportedModelError": "families",
    "prefill": "generate",
    "decode": "generate",
    "generate": "generate",
    "GenerationResult": "generate",
    "extend": "continuation",
    "continue_and_decode": "continuation",
    "cache_tensors": "cachefile",
    "cache_from_tensors": "cachefile",
    "requantized": "cachefile",
    "quantized_in_memory": "cachefile",
    "QuantLayer": "kvmemory",
    "KV_BITS": "config",
    "compress_by_reconstruction": "reconstruct",
    "reconstruction_scores": "reconstruct",
    "record": "replay",
    "replay": "replay",
    "METHODS": "methods",
    "resolve": "methods",
    "with_method": "methods",
    "ALLOCATIONS": "allocation",
    "INDICATORS": "indicators",
    "CakeCache": "cache",
    "NonFiniteError": "cache",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """Import the submodule holding `name` on first use (PEP 562)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
    return getattr(module, name)


def __dir__() -> list[str]:
    return __all__
