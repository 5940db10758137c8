"""CAKE settings for one run (spec §2-§5)."""

from __future__ import annotations

from dataclasses import dataclass

from cake_cli.errors import UsageError

DECODE_POLICIES = ("fixed", "grow")
ALLOCATIONS = ("uniform", "pyramid", "cake")
INDICATORS = ("cake", "snapkv", "h2o", "tova", "streaming")
POOL_KINDS = ("avg", "max")


@dataclass(frozen=True)
class CakeConfig:
    """Hyperparameters of the CAKE cache manager.

    Attributes:
        budget: B, tokens per layer on average, window included (paper's B·L notation:
            the evictable total is B_total = (B - w) · L, spec "Notation").
        window: w, observation window in tokens (the last w prompt tokens; never evicted).
        tau1: temperature of the spatial dispersion (Eq. 7), > 0.
        tau2: temperature of the temporal shift (Eq. 7), > 0.
        gamma: weight of the variance term in the eviction indicator (Eq. 11).
        pool_kind: "avg" (authors' code) or "max" (SnapKV) smoothing along tokens.
        pool_kernel: odd kernel size of that pooling, in tokens.
        decode_policy: "fixed" (every layer stays at its size after prefill, one token evicted
            per new token, spec §4) or "grow" (new tokens appended, nothing more evicted).
        allocation: how B_total is split over layers: "cake" (preference cascade, Eq. 7-10),
            "uniform" or "pyramid" (spec §6).
        indicator: which tokens a layer keeps: "cake" (Eq. 11), "snapkv", "h2o", "tova",
            "streaming" (spec §6). See `methods.py` for the named pairings.

    Raises:
        UsageError: from `validate` when a value is out of range.
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

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field; raise UsageError naming the option and the fix."""
        if self.window < 1:
            raise UsageError(f"--window must be at least 1 token (got {self.window})", "use e.g. --window 32")
        if self.budget < 1:
            raise UsageError(
                f"--budget must be a positive number of tokens (got {self.budget})", "use e.g. --budget 256"
            )
        if self.budget < self.window:
            raise UsageError(
                f"--budget {self.budget} is smaller than the observation window ({self.window} tokens)",
                f"raise --budget to at least {self.window} or lower --window",
            )
        if not (self.tau1 > 0 and self.tau2 > 0):
            raise UsageError(
                f"temperatures must be > 0 (got tau1={self.tau1}, tau2={self.tau2})",
                "use values in the paper's range, e.g. 0.2-3",
            )
        if not self.gamma >= 0:
            raise UsageError(f"gamma must be >= 0 (got {self.gamma})", "the paper uses gamma = 200")
        if self.pool_kind not in POOL_KINDS:
            raise UsageError(f"unknown pooling '{self.pool_kind}'", f"choose one of {', '.join(POOL_KINDS)}")
        if self.pool_kernel < 1 or self.pool_kernel % 2 == 0:
            raise UsageError(
                f"pooling kernel must be a positive odd number (got {self.pool_kernel})", "the paper uses 5"
            )
        if self.allocation not in ALLOCATIONS:
            raise UsageError(f"unknown allocation '{self.allocation}'", f"choose one of {', '.join(ALLOCATIONS)}")
        if self.indicator not in INDICATORS:
            raise UsageError(f"unknown indicator '{self.indicator}'", f"choose one of {', '.join(INDICATORS)}")
        if self.decode_policy not in DECODE_POLICIES:
            raise UsageError(
                f"unknown decode policy '{self.decode_policy}'", f"choose one of {', '.join(DECODE_POLICIES)}"
            )

    def evictable_total(self, num_layers: int) -> int:
        """B_total = (B - w) · L evictable cache slots over all layers, in tokens (spec Notation)."""
        return (self.budget - self.window) * num_layers
