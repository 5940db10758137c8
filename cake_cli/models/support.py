"""Which models cake-cli accepts: the engine's family contract (`engine.families`) as one-line errors.

The architecture is checked from metadata before any weight is read (config.json's
``model_type``, a GGUF's ``general.architecture``); the loaded model is checked again for what a
config can switch on (a sliding window, soft-capping), so a refusal comes at load time with a
hint rather than from the engine.
"""

from __future__ import annotations

from pathlib import Path

from cake_cli.engine.families import FAMILIES, UnsupportedModelError, check_model, check_model_type
from cake_cli.errors import CakeError, first_line
from cake_cli.models.profiles import DEFAULT_MODEL


def _family_names() -> str:
    """'Llama, Mistral or Qwen2'."""
    names = [f.name for f in FAMILIES.values()]
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]


def check_architecture(model_type: str | None, where: Path) -> None:
    """Refuse a ``model_type`` (or GGUF architecture) outside ``FAMILIES``.

    Raises:
        CakeError: naming the architecture, ``where`` it was read and the supported families.
    """
    try:
        check_model_type(model_type)
    except UnsupportedModelError as exc:
        raise CakeError(
            f"{first_line(exc)} ({where})", hint=f"use a {_family_names()} model, e.g. --model {DEFAULT_MODEL}"
        ) from None


def check_loaded(model, where: Path) -> None:
    """Refuse a loaded model the engine cannot compute exactly (see ``families.check_model``).

    Raises:
        CakeError: naming the feature (e.g. a sliding window in effect) and ``where`` the model is.
    """
    try:
        check_model(model)
    except UnsupportedModelError as exc:
        raise CakeError(
            f"{first_line(exc)} ({where})",
            hint="use a checkpoint with dense attention on every layer (config.json: sliding_window null, "
            "no soft-capping), e.g. Mistral-7B-Instruct-v0.3",
        ) from None
