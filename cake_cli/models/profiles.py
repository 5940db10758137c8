"""Model profiles: finding them by name, alias or hub id (the schema: :mod:`profile_schema`).

Profiles are searched, later directories overriding earlier ones by name:

1. the shipped ones: ``cake_cli/_profiles`` inside an installed wheel, else the repository's
   top-level ``profiles/`` (editable install / source checkout);
2. ``$CAKE_HOME/profiles/*.yaml`` (user profiles);
3. every directory in ``$CAKE_PROFILES_DIR`` (``os.pathsep``-separated; used by tests).

Only :mod:`cake_cli.models.profile_schema` knows the YAML layout; the rest of cake-cli sees the frozen
:class:`Profile`.
"""

from __future__ import annotations

import difflib
import importlib.resources
import os
from pathlib import Path

from cake_cli.errors import CakeError
from cake_cli.models.profile_schema import (  # noqa: F401 - re-exported: the public profile API
    SCHEMA_VERSION,
    Pooling,
    Profile,
    TauChoice,
    TauPoint,
    parse_profile,
)


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
    from cake_cli.models.loader import cake_home  # lazy: loader imports this module

    dirs = [_shipped_dir(), cake_home() / "profiles"]
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
        CakeError: no such profile; the message suggests close names ("did you mean …") and the
            hint lists the valid ones. Also any error of :func:`list_profiles`.
    """
    p = find_profile(name_or_alias)
    if p is None:
        raise unknown_profile_error(name_or_alias)
    return p


def unknown_profile_error(name: str, what: str = "model profile") -> CakeError:
    """A CakeError for an unknown profile name, with "did you mean …" and the valid names."""
    profiles = list_profiles()
    keys = [k for p in profiles for k in (p.name, *p.aliases)]
    close = difflib.get_close_matches(name.strip().lower(), keys, n=3, cutoff=0.5)
    msg = f"unknown {what} {name!r}"
    if close:
        msg += f"; did you mean {' or '.join(repr(c) for c in close)}?"
    valid = ", ".join(p.name for p in profiles) or "(none found)"
    return CakeError(msg, hint=f"valid profiles: {valid}")
