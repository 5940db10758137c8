"""What a model profile is: the frozen :class:`Profile`, its tau rule, and strict YAML parsing.

A profile file (``profiles/*.yaml``, ``version: 1``) names where the weights come from (exactly
one of ``hub_id``, ``embedded``, ``path``) and the CAKE hyperparameters for that model (spec
``cake-method.md`` §5): observation window ``w``, indicator weight ``gamma``, the pooling of the
indicator, and the published temperatures ``(tau1, tau2)`` per cache budget together with the
rule that serves the budgets in between. Unknown keys, missing keys, wrong types and other
versions are errors. Where profiles are looked up: :mod:`cake_cli.models.profiles`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cake_cli.errors import CakeError, UsageError
from cake_cli.models.gguf import EMBEDDED_MODELS

SCHEMA_VERSION = 1
DTYPES = ("float32", "bfloat16", "float16")
POOLING_KINDS = ("avg", "max")
TAU_RULES = ("log-linear", "nearest")

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")

_REQUIRED = (
    "version",
    "name",
    "description",
    "dtype",
    "max_prompt_tokens",
    "window",
    "gamma",
    "pooling",
    "taus",
    "tau_rule",
    "tau_source",
)
_OPTIONAL = ("aliases", "hub_id", "embedded", "path")
_SOURCES = ("hub_id", "embedded", "path")


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


def parse_profile(file: Path) -> Profile:
    """Read and strictly validate one profile file.

    Raises:
        CakeError: unreadable file, invalid YAML, wrong ``version``, unknown or missing key, a
            value of the wrong type or out of range, or ``name`` differing from the file stem.
    """
    file = Path(file)

    def bad(problem: str, hint: str | None = None) -> CakeError:
        return CakeError(f"invalid profile {file}: {problem}", hint=hint)

    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except OSError as e:
        raise CakeError(f"cannot read profile {file}: {e.strerror or e}") from e
    except yaml.YAMLError as e:
        raise bad(f"not valid YAML ({str(e).splitlines()[0]})") from e
    if not isinstance(data, dict):
        raise bad("expected a mapping of keys to values")
    if "version" not in data:
        raise bad("missing key 'version'", hint=f"add `version: {SCHEMA_VERSION}`")
    if data["version"] != SCHEMA_VERSION or isinstance(data["version"], bool):
        raise bad(
            f"unsupported version {data['version']!r}", hint=f"this cake-cli reads profile version {SCHEMA_VERSION}"
        )
    _check_keys(data, _REQUIRED, _OPTIONAL, "", bad)

    name = _str(data, "name", bad)
    if not _NAME_RE.match(name):
        raise bad(f"name {name!r} must be lower-case letters, digits, '.', '_' or '-'")
    if name != file.stem:
        raise bad(f"name {name!r} differs from the file name", hint=f"rename it {name}.yaml")
    aliases = data.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and _NAME_RE.match(a) for a in aliases):
        raise bad("'aliases' must be a list of lower-case names")

    sources = [k for k in _SOURCES if k in data]
    if len(sources) != 1:
        raise bad(f"needs exactly one of {', '.join(_SOURCES)} (found {len(sources)})")
    hub_id = embedded = path = None
    if "hub_id" in data:
        hub_id = _str(data, "hub_id", bad)
        if not _HUB_ID_RE.match(hub_id):
            raise bad(f"hub_id {hub_id!r} is not of the form org/name")
    if "embedded" in data:
        embedded = _str(data, "embedded", bad)
        if embedded not in EMBEDDED_MODELS:
            raise bad(f"unknown embedded model {embedded!r}", hint=f"known: {', '.join(EMBEDDED_MODELS)}")
    if "path" in data:
        path = Path(_str(data, "path", bad)).expanduser()
        if not path.is_absolute():
            path = (file.parent / path).resolve()

    dtype = _str(data, "dtype", bad)
    if dtype not in DTYPES:
        raise bad(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    tau_rule = _str(data, "tau_rule", bad)
    if tau_rule not in TAU_RULES:
        raise bad(f"tau_rule {tau_rule!r} is not one of {', '.join(TAU_RULES)}")

    pooling = data["pooling"]
    if not isinstance(pooling, dict):
        raise bad("'pooling' must be a mapping like {kind: avg, kernel: 5}")
    _check_keys(pooling, ("kind", "kernel"), (), "pooling.", bad)
    if pooling["kind"] not in POOLING_KINDS:
        raise bad(f"pooling.kind {pooling['kind']!r} is not one of {', '.join(POOLING_KINDS)}")
    kernel = _int(pooling, "kernel", bad, "pooling.")
    if kernel % 2 == 0:
        raise bad(f"pooling.kernel must be odd (got {kernel}) so pooling keeps the length")

    taus = data["taus"]
    if not isinstance(taus, list) or not taus:
        raise bad("'taus' must be a non-empty list of {budget, tau1, tau2}")
    points = []
    for i, t in enumerate(taus):
        where = f"taus[{i}]."
        if not isinstance(t, dict):
            raise bad(f"taus[{i}] must be a mapping like {{budget: 128, tau1: 1.0, tau2: 1.0}}")
        _check_keys(t, ("budget", "tau1", "tau2"), (), where, bad)
        points.append(
            TauPoint(_int(t, "budget", bad, where), _float(t, "tau1", bad, where), _float(t, "tau2", bad, where))
        )
    points.sort(key=lambda p: p.budget)
    budgets = [p.budget for p in points]
    if len(set(budgets)) != len(budgets):
        raise bad(f"taus has a budget listed twice ({budgets})")

    return Profile(
        name=name,
        description=_str(data, "description", bad),
        dtype=dtype,
        max_prompt_tokens=_int(data, "max_prompt_tokens", bad),
        window=_int(data, "window", bad),
        gamma=_float(data, "gamma", bad, positive=False),
        pooling=Pooling(pooling["kind"], kernel),
        taus=tuple(points),
        tau_rule=tau_rule,
        tau_source=_str(data, "tau_source", bad),
        source_file=file,
        aliases=tuple(aliases),
        hub_id=hub_id,
        embedded=embedded,
        path=path,
    )


def _check_keys(d: dict, required, optional, where: str, bad) -> None:
    unknown = [k for k in d if k not in required and k not in optional]
    if unknown:
        raise bad(
            f"unknown key '{where}{unknown[0]}'",
            hint=f"allowed keys: {', '.join(where + k for k in (*required, *optional))}",
        )
    missing = [k for k in required if k not in d]
    if missing:
        raise bad(f"missing key '{where}{missing[0]}'")


def _str(d: dict, key: str, bad) -> str:
    v = d[key]
    if not isinstance(v, str) or not v.strip():
        raise bad(f"'{key}' must be a non-empty string")
    return v


def _int(d: dict, key: str, bad, where: str = "") -> int:
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise bad(f"'{where}{key}' must be a positive integer (got {v!r})")
    return v


def _float(d: dict, key: str, bad, where: str = "", positive: bool = True) -> float:
    v: Any = d[key]
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or not math.isfinite(v)
        or (v <= 0 if positive else v < 0)
    ):
        kind = "positive" if positive else "non-negative"
        raise bad(f"'{where}{key}' must be a {kind} number (got {v!r})")
    return float(v)
