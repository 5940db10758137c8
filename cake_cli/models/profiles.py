"""Model profiles: finding them by name, alias or hub id (the type: :mod:`profile`; files: :mod:`profile_schema`).

Profiles are searched, later directories overriding earlier ones by name:

1. the shipped ones: ``cake_cli/_profiles`` inside an installed wheel, else the repository's
   top-level ``profiles/`` (editable install / source checkout);
2. ``$CAKE_HOME/profiles/*.yaml`` (user profiles);
3. every directory in ``$CAKE_PROFILES_DIR`` (``os.pathsep``-separated; used by tests).

Only :mod:`cake_cli.models.profile_schema` knows the YAML layout; the rest of cake-cli sees the frozen
:class:`Profile`. Also which model a ``--model`` value means (:func:`model_spec`, the default
:data:`DEFAULT_MODEL`) and its profile (:func:`profile_of`), without loading torch.
"""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

from cake_cli.errors import CakeError, UsageError, did_you_mean
from cake_cli.models.checkpoints import embedded_of_path
from cake_cli.models.profile_schema import HUB_ID_RE, parse_profile, validate_profile  # noqa: F401 - re-exported
from cake_cli.models.profile_types import (  # noqa: F401 - re-exported: the public profile API
    SCHEMA_VERSION,
    Pooling,
    Profile,
    TauChoice,
    TauPoint,
)
from cake_cli.paths import user_profiles_dir

DEFAULT_MODEL = "qwen2.5-coder-0.5b"  # the embedded Qwen2.5-Coder-0.5B-Instruct (profiles/qwen2.5-coder-0.5b.yaml)


def _shipped_dir() -> Path | None:
    """The shipped profiles: ``cake_cli/_profiles`` in a wheel, else the repo's ``profiles/``."""
    try:
        packaged = Path(str(importlib.resources.files("cake_cli") / "_profiles"))
        if packaged.is_dir():
            return packaged
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - zipped installs
        pass
    repo = Path(__file__).resolve().parents[2] / "profiles"
    return repo if repo.is_dir() else None


def profile_dirs() -> list[Path]:
    """Directories searched for ``*.yaml`` profiles, lowest precedence first (existing only)."""
    dirs = [_shipped_dir(), user_profiles_dir()]
    extra = os.environ.get("CAKE_PROFILES_DIR", "")
    dirs += [Path(p).expanduser() for p in extra.split(os.pathsep) if p]
    return [d for d in dirs if d is not None and d.is_dir()]


def list_profiles() -> list[Profile]:
    """Every available profile, sorted by name (later directories override earlier by name).

    Raises:
        CakeError: a profile file is invalid (the message names the file and the problem), or
            two profiles claim the same name or alias.
    """
    by_name: dict[str, Profile] = {}
    for d in profile_dirs():
        for f in sorted(d.glob("*.yaml")):
            p = parse_profile(f)
            by_name[p.name] = p
    owner: dict[str, Profile] = {}
    for p in by_name.values():
        for key in (p.name, *p.aliases):
            other = owner.get(key)
            if other is not None and other is not p:
                raise CakeError(
                    f"profile name or alias {key!r} is claimed by both {other.source_file} and {p.source_file}",
                    hint="rename or remove one of them",
                )
            owner[key] = p
    return sorted(by_name.values(), key=lambda p: p.name)


def find_profile(name_or_alias: str) -> Profile | None:
    """The profile whose name, else alias, else hub id is ``name_or_alias`` (case-insensitive),
    or None."""
    key = name_or_alias.strip().lower()
    profiles = list_profiles()
    return (
        next((p for p in profiles if p.name == key), None)
        or next((p for p in profiles if key in p.aliases), None)
        or next((p for p in profiles if p.hub_id and p.hub_id.lower() == key), None)
    )


def load_profile(name_or_alias: str) -> Profile:
    """The profile named (or aliased) ``name_or_alias``.

    Raises:
        UsageError: no such profile (exit 2); the message suggests close names ("did you mean …") and the
            hint lists the valid ones. Also any error of :func:`list_profiles`.
    """
    p = find_profile(name_or_alias)
    if p is None:
        raise unknown_profile_error(name_or_alias)
    return p


def unknown_model_error(name: str) -> UsageError:
    """The UsageError (exit 2) for a ``--model`` value that is no path, profile or hub id."""
    err = unknown_profile_error(name, "model")
    err.hint = (
        f"{err.hint}; or give a local model directory, a .gguf file, or a hub id "
        "org/name already in the Hugging Face cache"
    )
    return err


def unknown_profile_error(name: str, what: str = "model profile") -> UsageError:
    """A UsageError (exit 2) for an unknown profile name, with "did you mean …" and the valid names."""
    profiles = list_profiles()
    keys = [k for p in profiles for k in (p.name, *p.aliases)]
    valid = ", ".join(p.name for p in profiles) or "(none found)"
    return UsageError(f"unknown {what} {name!r}{did_you_mean(name, keys)}", hint=f"valid profiles: {valid}")


def embedded_profile(source: str) -> Profile | None:
    """The profile (first by name) whose ``embedded:`` is ``source``, or None."""
    return next((p for p in list_profiles() if p.embedded == source), None)


def model_spec(spec: str | None) -> str:
    """The model to use: ``spec``, else ``$CAKE_MODEL``, else :data:`DEFAULT_MODEL`."""
    return spec or os.environ.get("CAKE_MODEL") or DEFAULT_MODEL


def profile_of(spec: str | None) -> Profile | None:
    """The profile a ``--model`` value means, without loading any weight or torch.

    A name, alias or hub id: its profile (None when unknown). An existing path: the embedded
    model's profile when the path is that model's GGUF (same size and sha256) or its converted
    folder (by the conversion marker), else None.
    """
    spec = model_spec(spec)
    path = Path(spec).expanduser()
    if path.exists():
        em = embedded_of_path(path)
        return embedded_profile(em.source) if em else None
    return find_profile(spec)


def check_model_spec(spec: str | None) -> Profile | None:
    """:func:`profile_of`, refusing first what no load could serve: cheap, no torch, no weights.

    Raises:
        CakeError: a path that does not exist, or a name that is no profile, alias or hub id
            (with "did you mean …" and the valid names).
    """
    spec = model_spec(spec)
    if Path(spec).expanduser().exists():
        return profile_of(spec)
    if spec.startswith((".", "/", "~")) or spec.lower().endswith(".gguf") or spec.count("/") > 1:
        raise CakeError(f"no such file or directory: {spec}")
    profile = find_profile(spec)
    if profile is None and not HUB_ID_RE.match(spec):
        raise unknown_model_error(spec)
    return profile
