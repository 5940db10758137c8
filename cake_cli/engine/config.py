"""CAKE settings for one run (docs/method.md §Budget to §Hyperparameters), validated on construction. Pure Python (no
torch)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cake_cli.engine.allocation import ALLOCATIONS, SCORE_ALLOCATIONS
from cake_cli.engine.indicators import DEFAULT_CHUNK, INDICATORS

DECODE_POLICIES = ("fixed", "grow")
POOL_KINDS = ("avg", "max")
KV_BITS = (16, 8, 4, 2)  # bits per saved key/value: 16 = the model's dtype, 8 / 4 / 2 = grouped affine (`kvquant`)
DEFAULT_KV_SINK = 4  # first tokens of a layer kept exact in a quantized file (format 5; benchmarks/cache.md)
DEFAULT_KV_GROUP = 32  # entries per quantization group (KIVI's group size): keys' tokens
DEFAULT_KV_VALUE_GROUP = 64  # channels per value group of a rotated file (format 6; `kvquant`, benchmarks/cache.md)


class ConfigError(ValueError):
    """A setting out of range or an unknown name.

    Args:
        field: the CakeConfig field (or "method") at fault.
        message: one line naming the problem; "{field}" placeholders (e.g. "{budget}") stand for
            the name the caller knows the setting by.
        hint: one line naming the fix, with the same placeholders, or None.
        name: for an unknown name, the name given; valid: the names it could have been (a front end
            may suggest the nearest, "did you mean").

    `str(exc)` uses the field names; a front end calls `render(names)` with its own (e.g. flags).
    """

    def __init__(
        self, field: str, message: str, hint: str | None = None, name: str | None = None, valid: Sequence[str] = ()
    ):
        self.field = field
        self.name = name
        self.valid = tuple(valid)
        self.template = message
        self.hint_template = hint
        super().__init__(self.render({})[0])

    def render(self, names: Mapping[str, str]) -> tuple[str, str | None]:
        """(message, hint) with every "{field}" replaced by names.get(field, field)."""

        class _Names(dict):
            def __missing__(self, key):
                return key

        table = _Names(names)
        return self.template.format_map(table), self.hint_template.format_map(table) if self.hint_template else None


@dataclass(frozen=True)
class CakeConfig:
    """Hyperparameters of the CAKE cache manager.

    Attributes:
        budget: B, tokens per layer on average, window included (paper's B·L notation:
            the evictable total is B_total = (B - w) · L, docs/method.md §Budget).
        window: w, observation window in tokens (the last w prompt tokens; never evicted).
        tau1: temperature of the spatial dispersion (Eq. 7), > 0.
        tau2: temperature of the temporal shift (Eq. 7), > 0.
        gamma: weight of the variance term in the eviction indicator (Eq. 11).
        pool_kind: "avg" (authors' code) or "max" (SnapKV) smoothing along tokens.
        pool_kernel: odd kernel size of that pooling, in tokens.
        decode_policy: "fixed" (every layer stays at its size after prefill, or grows up to B
            when nothing was evicted; then one token evicted per new token, docs/method.md §Decoding) or "grow" (new
            tokens appended, nothing more evicted).
        allocation: how B_total is split over layers, a key of `allocation.ALLOCATIONS`:
            "cake" (preference cascade, Eq. 7-10), "uniform" or "pyramid" (docs/method.md §Baselines); or
            "global" (`allocation.SCORE_ALLOCATIONS`: KVzip's one ranking, reconstruction scoring only).
        indicator: which tokens a layer keeps, a key of `indicators.INDICATORS`: "cake"
            (Eq. 11), "snapkv", "h2o", "tova", "streaming", "chunk" (docs/method.md §Baselines). Named pairings:
            `methods.py`.
        chunk: tokens per chunk of the "chunk" indicator (CAKE's score averaged over fixed chunks of
            consecutive positions, `indicators.chunk_means`), >= 1; default 10 as in ChunkKV (Liu et al.
            2025). Read by that indicator only.
        score_rows: r, how many of the observation window's query rows score the prompt at prefill, >= 0.
            When > 0 the eviction indicator and the layer statistics (dispersion and shift, hence the
            preference and CAKE's allocation, Eqs. 5-8) read only the last min(r, w) rows of the window
            attention [H, w, n] (e.g. the question's tokens and the chat template's closing, not the fixed
            instruction before them); the w window tokens are still all kept and the budgets are unchanged.
            0 (the default) = all w rows, the paper's method. Decode scores with its one new query row
            and is unaffected; reconstruction scoring (`engine.reconstruct`) does not read it.
        rank_layer: R, 0-based, or None (the paper's method: every layer ranks its own tokens). When set, every
            scored layer below R keeps the tokens that layer R's indicator ranks highest (its scores, each KV head's
            normalised to sum 1, averaged over the KV heads: one ranking shared by every head), not its own: the
            depth whose attention GemFilter (Shi et al. 2024) found to pick out the passage a question needs, where
            the lowest layers' window attention spreads over local and syntactic tokens. Budgets are unchanged;
            the layers below R are evicted once R has attended (they hold the whole prompt until then, which
            raises the prefill's peak KV memory to about R / L of the full cache). Not the paper's method.

    Raises:
        ConfigError: from `validate` when a value is out of range (naming the field).
    """

    budget: int
    window: int = 32
    tau1: float = 1.0
    tau2: float = 1.0
    gamma: float = 200.0
    pool_kind: str = "avg"
    pool_kernel: int = 5
    decode_policy: str = "fixed"
    allocation: str = "cake"
    indicator: str = "cake"
    chunk: int = DEFAULT_CHUNK
    score_rows: int = 0
    rank_layer: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field; raise ConfigError naming the field and the fix."""
        if self.window < 1:
            raise ConfigError(
                "window", f"{{window}} must be at least 1 token (got {self.window})", "use e.g. {window} 32"
            )
        if self.budget < 1:
            raise ConfigError(
                "budget", f"{{budget}} must be a positive number of tokens (got {self.budget})", "use e.g. {budget} 256"
            )
        if self.budget < self.window:
            raise ConfigError(
                "budget",
                f"{{budget}} {self.budget} is smaller than the observation window ({self.window} tokens)",
                f"raise {{budget}} to at least {self.window} or lower {{window}}",
            )
        if not (self.tau1 > 0 and self.tau2 > 0):
            raise ConfigError(
                "tau1",
                f"temperatures must be > 0 (got tau1={self.tau1}, tau2={self.tau2})",
                "use values in the paper's range, e.g. 0.2-3",
            )
        if not self.gamma >= 0:
            raise ConfigError("gamma", f"gamma must be >= 0 (got {self.gamma})", "the paper uses gamma = 200")
        if self.pool_kind not in POOL_KINDS:
            raise ConfigError(
                "pool_kind",
                f"unknown pooling '{self.pool_kind}'",
                f"choose one of {', '.join(POOL_KINDS)}",
                self.pool_kind,
                POOL_KINDS,
            )
        if self.pool_kernel < 1 or self.pool_kernel % 2 == 0:
            raise ConfigError(
                "pool_kernel",
                f"pooling kernel must be a positive odd number (got {self.pool_kernel})",
                "the paper uses 5",
            )
        for field, value, least, what, hint in (
            ("chunk", self.chunk, 1, "a whole number of tokens, at least 1",
             f"ChunkKV uses {DEFAULT_CHUNK}; 1 scores token by token (the cake indicator)"),
            ("score_rows", self.score_rows, 0, "a whole number of window rows, at least 0",
             "0 scores with all w window rows (the paper's method)"),
            ("rank_layer", 0 if self.rank_layer is None else self.rank_layer, 0, "a layer index, at least 0",
             "leave it unset for the paper's method (every layer ranks its own tokens)"),
        ):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(field, f"{field} must be {what} (got {value!r})", hint)
        for field, value, valid in (
            ("allocation", self.allocation, (*ALLOCATIONS, *SCORE_ALLOCATIONS)),
            ("indicator", self.indicator, INDICATORS),
            ("decode_policy", self.decode_policy, DECODE_POLICIES),
        ):
            if value not in valid:
                what = field.replace("_", " ")
                raise ConfigError(field, f"unknown {what} '{value}'", f"choose one of {', '.join(valid)}", value, valid)

    @property
    def scoring_rows(self) -> int:
        """The observation window's query rows that score the prompt at prefill: min(score_rows, w), or w when 0."""
        return min(self.score_rows, self.window) if self.score_rows > 0 else self.window

    def evictable_total(self, num_layers: int) -> int:
        """B_total = (B - w) · L evictable cache slots over `num_layers` scored layers (the global ones), in tokens
        (docs/method.md §Budget)."""
        return (self.budget - self.window) * num_layers


@dataclass(frozen=True)
class SamplingConfig:
    """Next-token choice. temperature 0 = greedy; otherwise sample from softmax(logits / temperature)
    within top-p. no_repeat_ngram_size > 0 forbids repeating any n-gram of that many tokens (prompt
    included), in greedy and sampled decoding alike.

    Raises:
        ConfigError: temperature < 0, top_p outside (0, 1], or a negative n-gram size.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    no_repeat_ngram_size: int = 0

    def __post_init__(self) -> None:
        if not self.temperature >= 0 or not 0 < self.top_p <= 1:
            raise ConfigError(
                "temperature", "{temperature} must be >= 0 and {top_p} in (0, 1]", "e.g. {temperature} 0.7 {top_p} 0.9"
            )
        if self.no_repeat_ngram_size < 0:
            raise ConfigError(
                "no_repeat_ngram_size",
                f"{{no_repeat_ngram_size}} must be >= 0 (got {self.no_repeat_ngram_size})",
                "0 turns it off",
            )
