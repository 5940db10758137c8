"""Where cake-cli keeps its files: the cache/config directory and what lives in it.

``$CAKE_HOME`` when set, else the platform's user cache directory for ``cake-cli``
(platformdirs: ``$XDG_CACHE_HOME/cake-cli`` or ``~/.cache/cake-cli`` on Linux). Nothing is created here.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "cake-cli"


def cake_home() -> Path:
    """cake-cli's cache/config directory (see the module docstring). Not created here."""
    if os.environ.get("CAKE_HOME"):
        return Path(os.environ["CAKE_HOME"]).expanduser()
    return Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))


def models_dir() -> Path:
    """Converted and downloaded model checkpoints: ``cake_home()/models``."""
    return cake_home() / "models"


def user_profiles_dir() -> Path:
    """The user's own profiles: ``cake_home()/profiles``."""
    return cake_home() / "profiles"
