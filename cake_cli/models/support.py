"""Which models cake-cli accepts: the engine's family contract (`engine.families`) as one-line errors.

The architecture is checked from metadata before any weight is read (config.json's
``model_type``, a GGUF's ``general.architecture``); the loaded model is checked again for what a
config can switch on (bidirectional attention, an unknown layer type), so a refusal comes at load
time with a hint rather than from the engine.
"""

from __future__ import annotations

from pathlib import Path

from cake_cli.engine.families import (
    FAMILIES,
    UnsupportedModelError,
    check_model,
    check_model_type,
    model_type_of_gguf,
)
from cake_cli.errors import CakeError, first_line
from cake_cli.models.profiles import DEFAULT_MODEL


def _family_names() -> str:
    """'Llama, Mistral, ... or Phi-3'."""
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


def check_gguf_architecture(arch: str | None, where: Path) -> None:
    """Refuse a GGUF whose ``general.architecture`` (llama.cpp's name: gemma3, phi3, ...) belongs to
    no family; read from metadata, before converting.

    Raises:
        CakeError: as `check_architecture`, naming the GGUF architecture.
    """
    check_architecture(model_type_of_gguf(arch), where)


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
            hint="use a causal checkpoint of a supported family with full or sliding-window attention layers "
            f"(`cake env` lists them), e.g. --model {DEFAULT_MODEL}",
        ) from None
