"""A model profile as the rest of cake-cli sees it: the frozen :class:`Profile` and its tau rule.

Built only by :mod:`cake_cli.models.profile_schema` from a validated YAML file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from cake_cli.engine.indicators import DEFAULT_CHUNK
from cake_cli.errors import UsageError

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Pooling:
    """1-D pooling of the eviction indicator along tokens (stride 1, padding kernel // 2)."""

    kind: str  # "avg" (CAKE authors' code) or "max" (SnapKV)
    kernel: int  # tokens; odd, so the pooled length equals the input length


@dataclass(frozen=True)
class TauPoint:
    """One published temperature pair: at cache budget ``budget`` (tokens per layer) use it."""

    budget: int
    tau1: float
    tau2: float


@dataclass(frozen=True)
class TauChoice:
    """The temperatures chosen for one budget, and how (``rule``, for the run report)."""

    tau1: float
    tau2: float
    rule: str  # e.g. "interpolated log-linearly between B=128 and B=1024"


@dataclass(frozen=True)
class Profile:
    """A validated model profile (see the module docstring for where profiles come from).

    Exactly one of ``hub_id`` / ``embedded`` / ``path`` is set. ``taus`` is sorted by budget,
    budgets unique. ``source_file`` is the YAML file the profile was read from.
    """

    name: str
    description: str
    dtype: str  # preferred dtype on CUDA; CPU loads float32 unless the user asks otherwise
    max_prompt_tokens: int  # tokens
    window: int  # observation window w, tokens
    gamma: float  # variance weight of the eviction indicator (Eq. 11)
    pooling: Pooling
    taus: tuple[TauPoint, ...]
    tau_rule: str  # "log-linear" or "nearest"
    tau_source: str
    method: str = "cake"  # the tasks' method when --method is not given (engine.methods.METHODS, not full)
    chunk: int = DEFAULT_CHUNK  # tokens per chunk of the cake-chunk method (CakeConfig.chunk)
    # `--abstain doubt`: an unsupported answer is withheld when the model's probability of abstaining
    # reaches this, 0-1 (None: `tasks.answers.abstain.DOUBT_THRESHOLD`); searched per model (benchmarks/real.md)
    doubt_threshold: float | None = None
    # bits of the .cake files `cake compress` writes when --kv-bits is not given (engine.config.KV_BITS), and why
    # (the evidence, benchmarks/cache.md); 16 keeps the model's dtype
    kv_bits: int = 16
    kv_bits_source: str | None = None
    source_file: Path | None = None
    aliases: tuple[str, ...] = ()
    hub_id: str | None = None
    embedded: str | None = None
    path: Path | None = None
    version: int = SCHEMA_VERSION

    @property
    def display_name(self) -> str:
        """``"name (description)"``, e.g. ``"smollm2 (SmolLM2-135M-Instruct)"``."""
        return f"{self.name} ({self.description})"

    def taus_for(self, budget: int) -> TauChoice:
        """Temperatures ``(tau1, tau2)`` for a cache budget of ``budget`` tokens per layer.

        ``log-linear``: linear interpolation in ``log2(budget)`` between the two published points
        around ``budget``; outside the published range the nearest end point is used (clamped).
        ``nearest``: the published point nearest in ``log2(budget)`` (ties go to the smaller
        budget). An exact published budget always returns that point.

        Raises:
            UsageError: ``budget`` is not a positive integer.
        """
        if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
            raise UsageError(f"budget must be a positive number of tokens, got {budget!r}")
        points = self.taus
        budgets = [p.budget for p in points]
        if budget in budgets:
            p = points[budgets.index(budget)]
            return TauChoice(p.tau1, p.tau2, f"exact published point B={budget}")
        if budget < budgets[0] or budget > budgets[-1]:
            p = points[0] if budget < budgets[0] else points[-1]
            return TauChoice(p.tau1, p.tau2, f"clamped to nearest published point B={p.budget}")
        hi = next(i for i, b in enumerate(budgets) if b > budget)
        lo_p, hi_p = points[hi - 1], points[hi]
        x = math.log2(budget)
        x0, x1 = math.log2(lo_p.budget), math.log2(hi_p.budget)
        if self.tau_rule == "nearest":
            p = lo_p if x - x0 <= x1 - x else hi_p
            return TauChoice(p.tau1, p.tau2, f"nearest published point B={p.budget}")
        t = (x - x0) / (x1 - x0)  # in (0, 1)
        return TauChoice(
            lo_p.tau1 + t * (hi_p.tau1 - lo_p.tau1),
            lo_p.tau2 + t * (hi_p.tau2 - lo_p.tau2),
            f"interpolated log-linearly between B={lo_p.budget} and B={hi_p.budget}",
        )
