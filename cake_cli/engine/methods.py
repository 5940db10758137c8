"""KV-eviction methods as pairings of an allocation and an indicator (docs/method.md §Baselines, paper Sec. 5.5).

An indicator maps window attention to token scores (`indicators.INDICATORS`); an allocation maps
layer statistics to budgets (`allocation.ALLOCATIONS`). CAKE is one pairing; the baselines are
others, and every pairing runs through the same engine path (cascade.py, decode.py). Adding a
method is one row here (plus its indicator or allocation if it brings a new one).

| method       | allocation | indicator  |
|--------------|------------|------------|
| streamingllm | uniform    | streaming  |
| h2o          | uniform    | h2o        |
| tova         | uniform    | tova       |
| snapkv       | uniform    | snapkv     |
| pyramidkv    | pyramid    | snapkv     |
| cake         | cake       | cake       |
| cake-chunk   | cake       | chunk      |
| cake-qwin    | cake       | cake       | (+ the question's rows score, `QUESTION_METHODS`)
| full         | (no eviction)           |

`h2o` is H2O's heavy-hitter score (Zhang et al. 2023): the attention every prompt query (and, at
decode, every generated one) paid a token, accumulated block by block (`window.accumulated_attention`).
`cake-chunk` is not the paper's: CAKE's budgets with CAKE's indicator averaged over fixed chunks of
`CakeConfig.chunk` consecutive positions (`indicators.chunk_means`, ChunkKV's span-level selection), so a
layer keeps whole spans; `cake` stays the paper's method. `cake-qwin` (not the paper's either, and not a
METHODS key: `QUESTION_METHODS`) is CAKE scored with only the observation window's rows from the question's
first token on (`CakeConfig.score_rows`, set per prompt by whoever knows the question: `cake bench quality
--suite real`).

Pure data (no torch), so the command line can check names before loading the model.
"""

from __future__ import annotations

from dataclasses import replace

from cake_cli.engine.allocation import ALLOCATIONS, SCORE_ALLOCATIONS
from cake_cli.engine.config import CakeConfig, ConfigError
from cake_cli.engine.indicators import INDICATORS

FULL = "full"
METHODS: dict[str, tuple[str, str] | None] = {
    FULL: None,
    "streamingllm": ("uniform", "streaming"),
    "h2o": ("uniform", "h2o"),
    "tova": ("uniform", "tova"),
    "snapkv": ("uniform", "snapkv"),
    "pyramidkv": ("pyramid", "snapkv"),
    "cake": ("cake", "cake"),
    "cake-chunk": ("cake", "chunk"),
}
QUESTION_METHODS: dict[str, str] = {"cake-qwin": "cake"}  # name -> the METHODS entry it runs, its prefill
# scored with the question's window rows only (`CakeConfig.score_rows`, per prompt; `tasks.question_window`)
BEYOND_PAPER = ("cake-chunk",)  # methods of this project, not the paper's; run by `cake bench quality` when named
PAPER_METHODS = tuple(name for name in METHODS if name not in BEYOND_PAPER)  # `cake bench quality`'s default grid


def resolve(method: str, allocation: str | None = None, indicator: str | None = None) -> tuple[str, str] | None:
    """The (allocation, indicator) pairing a method stands for, with optional overrides.

    Args:
        method: a key of METHODS, or a pairing written "allocation+indicator" (Sec. 5.5),
            e.g. "cake+snapkv".
        allocation: replace the method's allocation (a key of ALLOCATIONS), or None.
        indicator: replace the method's indicator (a key of INDICATORS), or None.

    Returns:
        (allocation, indicator), or None for "full" (no eviction; overrides are ignored).

    Raises:
        ConfigError: an unknown method, allocation or indicator (field "method", "allocation" or
            "indicator").
    """
    if "+" in method:
        pair = tuple(method.split("+", 1))
    elif method in METHODS:
        pair = METHODS[method]
    else:
        valid = [*METHODS, "allocation+indicator"]
        raise ConfigError("method", f"unknown method '{method}'", f"choose one of {', '.join(valid)}", method, METHODS)
    if pair is None:
        return None
    pair = (allocation or pair[0], indicator or pair[1])
    allocations = (*ALLOCATIONS, *SCORE_ALLOCATIONS)  # global: reconstruction scoring only (checked by the caller)
    for field, name, valid in (("allocation", pair[0], allocations), ("indicator", pair[1], INDICATORS)):
        if name not in valid:
            raise ConfigError(field, f"unknown {field} '{name}'", f"choose one of {', '.join(valid)}", name, valid)
    return pair


def label(allocation: str, indicator: str) -> str:
    """The name of the method that pairs `allocation` with `indicator`: its METHODS key when one
    has this pairing (("cake", "cake") -> "cake"), else "allocation+indicator" (e.g. "cake+tova").
    Reports use it, so a name always says what ran, whatever `--method` the overrides started from."""
    named = next((name for name, pair in METHODS.items() if pair == (allocation, indicator)), None)
    return named or f"{allocation}+{indicator}"


def with_method(
    base: CakeConfig, method: str, allocation: str | None = None, indicator: str | None = None
) -> CakeConfig | None:
    """`base` switched to a method's allocation and indicator (see `resolve`); None for "full".

    Raises:
        ConfigError: see `resolve`.
    """
    pair = resolve(method, allocation, indicator)
    return None if pair is None else replace(base, allocation=pair[0], indicator=pair[1])
