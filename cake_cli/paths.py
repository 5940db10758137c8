"""Where cake-cli keeps its files: the cache/config directory and what lives in it.

``$CAKE_HOME`` when set, else the platform's user cache directory for ``cake-cli``
(platformdirs: ``$XDG_CACHE_HOME/cake-cli`` or ``~/.cache/cake-cli`` on Linux). Nothing is created here.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

from cake_cli.errors import CakeError

APP_NAME = "cake-cli"


def cake_home() -> Path:
    """cake-cli's cache/config directory (see the module docstring). Not created here."""
    if os.environ.get("CAKE_HOME"):
        return Path(os.environ["CAKE_HOME"]).expanduser()
    return Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))


def models_dir() -> Path:
    """Converted and downloaded model checkpoints: ``cake_home()/models``."""
    return cake_home() / "models"


def owned(path: Path) -> bool:
    """Whether `path` lies under `models_dir()`, where cake-cli replaces a file by renaming a new one
    over it (converted checkpoints, quantized weights), never by rewriting it in place: a file there
    may be memory-mapped for as long as a run lasts (`models.tensor_files`)."""
    return path.resolve().is_relative_to(models_dir().resolve())


def locks_dir() -> Path:
    """Lock files of work two cake runs must not do at once (`files.exclusive`): ``cake_home()/locks``."""
    return cake_home() / "locks"


def user_profiles_dir() -> Path:
    """The user's own profiles: ``cake_home()/profiles``."""
    return cake_home() / "profiles"


def check_home() -> Path:
    """`cake_home()`, checked before anything is written under it: it must be a folder, or not exist
    yet (it is created when needed).

    Raises:
        CakeError: it, or a path above it, is a file (not a folder).
    """
    home = cake_home()
    blocked = next((p for p in (home, *home.parents) if p.exists() and not p.is_dir()), None)
    if blocked is None:
        return home
    where = f"CAKE_HOME {home}" if os.environ.get("CAKE_HOME") else f"the cache folder {home}"
    what = "is a file" if blocked == home else f"is inside {blocked}, which is a file"
    if os.environ.get("CAKE_HOME"):
        hint = "point CAKE_HOME at a folder (it is created when needed), or unset it"
    else:
        hint = f"move {blocked} away, or set CAKE_HOME to a folder"
    raise CakeError(f"{where} {what}, not a folder", hint)
