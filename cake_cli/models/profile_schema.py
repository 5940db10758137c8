"""Profile files: strict validation of ``profiles/*.yaml`` into the frozen
:class:`~cake_cli.models.profile_types.Profile`.

A profile file (``profiles/*.yaml``, ``version: 1``) names where the weights come from (exactly
one of ``hub_id``, ``embedded``, ``path``) and the CAKE hyperparameters for that model (see
``docs/method.md`` §Hyperparameters): observation window ``w``, indicator weight ``gamma``, the pooling of the
indicator, and the published temperatures ``(tau1, tau2)`` per cache budget together with the
rule that serves the budgets in between.

The file is read with ``yaml.safe_load`` (no code runs) and validated by the pydantic model
:class:`ProfileFile`: unknown keys, missing keys, other versions and wrong types are errors, and
types are strict (``true`` is not a budget, ``"128"`` is not an integer). Pydantic's first error
becomes one line naming the file and the field (:func:`_one_line`). Where profiles are looked
up: :mod:`cake_cli.models.profiles`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from cake_cli.engine.config import KV_BITS
from cake_cli.engine.indicators import DEFAULT_CHUNK
from cake_cli.engine.methods import METHODS
from cake_cli.errors import CakeError
from cake_cli.models.embedded import EMBEDDED_MODELS
from cake_cli.models.profile_types import SCHEMA_VERSION, Pooling, Profile, TauPoint

DtypeName = Literal["float32", "bfloat16", "float16"]
PoolingKind = Literal["avg", "max"]
TauRule = Literal["log-linear", "nearest"]
DTYPES, POOLING_KINDS, TAU_RULES = get_args(DtypeName), get_args(PoolingKind), get_args(TauRule)
SOURCES = ("hub_id", "embedded", "path")
PROFILE_METHODS = tuple(m for m in METHODS if m != "full")  # a profile's default method evicts

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
HUB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")  # org/name


# --- the YAML layout, as pydantic models (strict: no coercion, no unknown keys) -----------------

_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)
PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]


def _fail(message: str) -> PydanticCustomError:
    """A validation error whose text is already our one-line problem."""
    return PydanticCustomError("cake", message)


def _non_empty(value: Any, key: str) -> Any:
    if not isinstance(value, str) or not value.strip():
        raise _fail(f"'{key}' must be a non-empty string")
    return value


class _PoolingFile(BaseModel):
    model_config = _STRICT
    kind: PoolingKind
    kernel: PositiveInt

    @field_validator("kernel")
    @classmethod
    def _odd(cls, kernel: int) -> int:
        if kernel % 2 == 0:
            raise _fail(f"pooling.kernel must be odd (got {kernel}) so pooling keeps the length")
        return kernel


class _TauFile(BaseModel):
    model_config = _STRICT
    budget: PositiveInt
    tau1: PositiveFloat
    tau2: PositiveFloat


class ProfileFile(BaseModel):
    """One profile file as written (validation context: ``{"stem": <file stem>}``)."""

    model_config = _STRICT
    version: int
    name: str
    description: str
    hub_id: str | None = None
    embedded: str | None = None
    path: str | None = None
    aliases: tuple[str, ...] = ()
    dtype: DtypeName
    max_prompt_tokens: PositiveInt
    window: PositiveInt
    gamma: NonNegativeFloat
    pooling: _PoolingFile
    taus: list[_TauFile] = Field(min_length=1)
    tau_rule: TauRule
    tau_source: str
    method: str = "cake"
    chunk: PositiveInt = DEFAULT_CHUNK
    doubt_threshold: float | None = Field(default=None, gt=0.0, le=1.0)
    kv_bits: int = 16
    kv_bits_source: str | None = None

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, v: Any) -> int:
        if isinstance(v, bool) or v != SCHEMA_VERSION:
            raise _fail(f"unsupported version {v!r}")
        return v

    @field_validator("name", "description", "tau_source", "kv_bits_source", "hub_id", "embedded", "path", mode="before")
    @classmethod
    def _strings(cls, v: Any, info: ValidationInfo) -> Any:
        return _non_empty(v, info.field_name)  # `hub_id: null` too: absent is fine, null is not

    @field_validator("name")
    @classmethod
    def _name(cls, name: str, info: ValidationInfo) -> str:
        if not _NAME_RE.match(name):
            raise _fail(f"name {name!r} must be lower-case letters, digits, '.', '_' or '-'")
        stem = (info.context or {}).get("stem")
        if stem is not None and name != stem:
            raise _fail(f"name {name!r} differs from the file name")
        return name

    @field_validator("aliases", mode="before")
    @classmethod
    def _aliases(cls, v: Any) -> tuple[str, ...]:
        if not isinstance(v, list) or not all(isinstance(a, str) and _NAME_RE.match(a) for a in v):
            raise _fail("'aliases' must be a list of lower-case names")
        return tuple(v)

    @field_validator("kv_bits", mode="before")
    @classmethod
    def _kv_bits(cls, bits: Any) -> int:
        if isinstance(bits, bool) or bits not in KV_BITS:
            raise _fail(f"kv_bits {bits!r} is not one of {', '.join(map(str, KV_BITS))}")
        return bits

    @field_validator("method")
    @classmethod
    def _method(cls, method: str) -> str:
        if method not in PROFILE_METHODS:
            raise _fail(f"method {method!r} is not one of {', '.join(PROFILE_METHODS)}")
        return method

    @field_validator("hub_id")
    @classmethod
    def _hub_id(cls, hub_id: str) -> str:
        if not HUB_ID_RE.match(hub_id):
            raise _fail(f"hub_id {hub_id!r} is not of the form org/name")
        return hub_id

    @field_validator("embedded")
    @classmethod
    def _embedded(cls, embedded: str) -> str:
        if embedded not in EMBEDDED_MODELS:
            raise PydanticCustomError("cake_embedded", f"unknown embedded model {embedded!r}")
        return embedded

    @model_validator(mode="after")
    def _whole(self) -> ProfileFile:
        found = [k for k in SOURCES if k in self.model_fields_set]
        if len(found) != 1:
            raise _fail(f"needs exactly one of {', '.join(SOURCES)} (found {len(found)})")
        budgets = sorted(t.budget for t in self.taus)
        if len(set(budgets)) != len(budgets):
            raise _fail(f"taus has a budget listed twice ({budgets})")
        return self


# --- reading a file -----------------------------------------------------------------------------

_CHOICES = {"dtype": DTYPES, "tau_rule": TAU_RULES, "pooling.kind": POOLING_KINDS}


def _where(loc: tuple) -> str:
    """('taus', 0, 'tau1') -> 'taus[0].tau1'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _must_be(leaf: str) -> str:
    if leaf in ("tau1", "tau2"):
        return "a positive number"
    if leaf == "gamma":
        return "a non-negative number"
    return "a positive integer"


def _one_line(error: dict) -> tuple[str, str | None]:
    """Our (problem, hint) for one pydantic error (see ``ValidationError.errors()``)."""
    kind, loc, got = error["type"], tuple(error["loc"]), error.get("input")
    where = _where(loc)
    if kind == "cake":
        return error["msg"], None
    if kind == "cake_embedded":
        return error["msg"], f"known: {', '.join(EMBEDDED_MODELS)}"
    if kind == "extra_forbidden":
        model = (
            {"pooling": _PoolingFile, "taus": _TauFile}.get(str(loc[0]), ProfileFile) if len(loc) > 1 else ProfileFile
        )
        prefix = where[: len(where) - len(str(loc[-1]))]
        return f"unknown key '{where}'", f"allowed keys: {', '.join(prefix + k for k in model.model_fields)}"
    if kind == "missing":
        return f"missing key '{where}'", (f"add `version: {SCHEMA_VERSION}`" if where == "version" else None)
    if kind == "literal_error":
        return f"{where} {got!r} is not one of {', '.join(_CHOICES[where])}", None
    if loc == ("taus",):
        return "'taus' must be a non-empty list of {budget, tau1, tau2}", None
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        if loc[0] == "taus":
            return f"taus[{loc[1]}] must be a mapping like {{budget: 128, tau1: 1.0, tau2: 1.0}}", None
        return "'pooling' must be a mapping like {kind: avg, kernel: 5}", None
    return f"'{where}' must be {_must_be(str(loc[-1]))} (got {got!r})", None


def _first_error(exc: ValidationError) -> dict:
    """The error to report: a bad version first, then unknown keys, then missing keys, then the rest."""

    def rank(e: dict) -> int:
        if tuple(e["loc"]) == ("version",):
            return 0
        return {"extra_forbidden": 1, "missing": 2}.get(e["type"], 3)

    return min(exc.errors(), key=rank)  # min keeps the first of equal rank (pydantic's field order)


def validate_profile(data: Any, file: Path) -> Profile:
    """Validate a profile's parsed YAML ``data`` as read from ``file`` (messages and the name check).

    Raises:
        CakeError: one line naming ``file`` and the first problem (see :func:`parse_profile`).
    """
    file = Path(file)

    def bad(problem: str, hint: str | None = None) -> CakeError:
        return CakeError(f"invalid profile {file}: {problem}", hint=hint)

    if not isinstance(data, dict):
        raise bad("expected a mapping of keys to values")
    try:
        spec = ProfileFile.model_validate(data, context={"stem": file.stem})
    except ValidationError as exc:
        problem, hint = _one_line(_first_error(exc))
        if "differs from the file name" in problem:
            hint = f"rename it {data['name']}.yaml"
        raise bad(problem, hint) from None
    path = None
    if spec.path is not None:
        path = Path(spec.path).expanduser()
        if not path.is_absolute():
            path = (file.parent / path).resolve()
    return Profile(
        name=spec.name,
        description=spec.description,
        dtype=spec.dtype,
        max_prompt_tokens=spec.max_prompt_tokens,
        window=spec.window,
        gamma=float(spec.gamma),
        pooling=Pooling(spec.pooling.kind, spec.pooling.kernel),
        taus=tuple(sorted((TauPoint(t.budget, float(t.tau1), float(t.tau2)) for t in spec.taus), key=_budget)),
        tau_rule=spec.tau_rule,
        tau_source=spec.tau_source,
        method=spec.method,
        chunk=spec.chunk,
        doubt_threshold=spec.doubt_threshold,
        kv_bits=spec.kv_bits,
        kv_bits_source=spec.kv_bits_source,
        source_file=file,
        aliases=spec.aliases,
        hub_id=spec.hub_id,
        embedded=spec.embedded,
        path=path,
    )


def _budget(p: TauPoint) -> int:
    return p.budget


def parse_profile(file: Path) -> Profile:
    """Read and strictly validate one profile file (``yaml.safe_load``: nothing in it runs).

    Raises:
        CakeError: unreadable file, invalid YAML, wrong ``version``, unknown or missing key, a
            value of the wrong type or out of range, or ``name`` differing from the file stem.
    """
    file = Path(file)
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except OSError as e:
        raise CakeError(f"cannot read profile {file}: {e.strerror or e}") from e
    except yaml.YAMLError as e:
        raise CakeError(f"invalid profile {file}: not valid YAML ({str(e).splitlines()[0]})") from e
    return validate_profile(data, file)
