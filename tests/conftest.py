"""Shared fixtures: tiny random models built in-process (no downloads)."""

from __future__ import annotations

import os

import pytest

from tests.helpers.models import tiny_llama

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="module")
def tiny_model():
    return tiny_llama()


@pytest.fixture(scope="session")
def tiny_profile_dir(tmp_path_factory):
    """A CAKE_PROFILES_DIR with profile `tiny-test` -> a saved tiny random Llama (4 layers, 8/2 heads)."""
    import yaml

    from tests.helpers.tiny import save_tiny_model

    root = tmp_path_factory.mktemp("tiny-profile")
    model_dir = save_tiny_model(root / "model", layers=4, heads=8, kv_heads=2, hidden=64)
    profiles = root / "profiles"
    profiles.mkdir()
    (profiles / "tiny-test.yaml").write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "name": "tiny-test",
                "description": "tiny random Llama for CLI tests",
                "path": str(model_dir),
                "dtype": "float32",
                "max_prompt_tokens": 1500,
                "window": 8,
                "gamma": 200.0,
                "pooling": {"kind": "avg", "kernel": 5},
                "taus": [{"budget": 32, "tau1": 1.0, "tau2": 1.0}, {"budget": 256, "tau1": 0.5, "tau2": 2.0}],
                "tau_rule": "log-linear",
                "tau_source": "test values",
            }
        )
    )
    return profiles


@pytest.fixture
def cli_env(tiny_profile_dir, tmp_path, monkeypatch):
    """Environment for CLI tests: the tiny profile, a private CAKE_HOME, no network."""
    monkeypatch.setenv("CAKE_PROFILES_DIR", str(tiny_profile_dir))
    monkeypatch.setenv("CAKE_HOME", str(tmp_path / "cake-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("CAKE_MODEL", raising=False)
    monkeypatch.delenv("CAKE_DEBUG", raising=False)
    return tmp_path
