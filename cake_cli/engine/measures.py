"""Derived figures every report shows, defined once (pure Python, no torch)."""

from __future__ import annotations


def saved_fraction(kept_bytes: int, full_bytes: int) -> float:
    """1 - kept / full KV bytes (0 when the full cache is empty): the share of the KV cache evicted."""
    return 1.0 - kept_bytes / full_bytes if full_bytes else 0.0


def tokens_per_second(steps: int, seconds: float) -> float:
    """Decode forward passes per second (0 when none ran, or none took measurable time)."""
    return steps / seconds if seconds > 0 else 0.0
