"""The lean quantized load (`models.lean_load`) against the ordinary one: a model whose linear layers
come straight from the int8/int4 cache must be the model the full load + quantization builds, tensor
for tensor, with the same fingerprint and logits; whatever it cannot match falls back to that load."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from cake_cli.errors import CakeError
from cake_cli.models import lean_load, loader, tensor_files, weights
from cake_cli.models.fingerprint import fingerprint
from cake_cli.models.loader import load_model
from cake_cli.models.quantize import Int4Linear, Int8Linear, W8A8Linear
from tests.helpers.mappings import file_mapping, mapping_size, needs_proc_maps
from tests.helpers.models import needs_fbgemm
from tests.helpers.tiny import save_tiny_model


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("CAKE_HOME", str(tmp_path / "cake-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("CAKE_MODEL", raising=False)


def _state(model) -> dict[str, torch.Tensor]:
    return {n: t for n, t in [*model.named_parameters(), *model.named_buffers()]}


def _logits(lm, ids) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([lm.model(ids).logits, lm.model(ids[:, -1:]).logits], dim=1)  # prefill rows + a decode row


def _as_float32(d):
    """Store the checkpoint in float32 (as a converted GGUF is): the lean load casts while reading."""
    path = d / "model.safetensors"
    save_file(
        {k: v.float().contiguous() for k, v in load_file(str(path)).items()}, str(path), metadata={"format": "pt"}
    )
    return d


@pytest.mark.parametrize(
    "arch,scheme,tied",
    [
        ("llama", "int8", False),
        ("qwen2", "int8", True),
        ("qwen2", "int4", False),
        ("llama", "int4", True),
        pytest.param("qwen2", "w8a8", False, marks=needs_fbgemm),
    ],
)
def test_lean_load_builds_the_model_the_full_load_builds(tmp_path, monkeypatch, arch, scheme, tied):
    d = _as_float32(save_tiny_model(tmp_path / "m", arch=arch, hidden=64, tie_word_embeddings=tied))
    messages: list[str] = []
    full = load_model(str(d), dtype="bfloat16", weights=scheme, progress=messages.append)  # quantizes, caches
    assert any("saved to" in m for m in messages)
    messages.clear()
    monkeypatch.setattr(loader, "_load_dir", lambda *a: pytest.fail("the float checkpoint was loaded"))
    lean = load_model(str(d), dtype="bfloat16", weights=scheme, progress=messages.append)
    assert any(f"{scheme} weights read from" in m for m in messages)
    linear = Int4Linear if scheme == "int4" else Int8Linear  # w8a8 keeps the down projection int8
    assert isinstance(lean.model.model.layers[0].mlp.down_proj, linear)
    a, b = _state(full.model), _state(lean.model)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and not b[name].is_meta, name
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=0, msg=name)
    assert fingerprint(lean.model, lean.tokenizer) == fingerprint(full.model, full.tokenizer)
    ids = torch.randint(3, 400, (1, 9), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(_logits(lean, ids), _logits(full, ids), rtol=0, atol=0)
    assert lean.model.generation_config.eos_token_id == full.model.generation_config.eos_token_id


@needs_fbgemm
@pytest.mark.parametrize("dtype,expected", [("float32", "w8a8"), ("bfloat16", "int8")])
def test_auto_picks_by_the_models_dtype_on_both_loads(tmp_path, monkeypatch, dtype, expected):
    """`--weights auto` on CPU: a float32 model takes w8a8, a bf16 one int8 (`weights.auto_weights`),
    decided the same on the first load (which quantizes) and the lean one (from the empty model)."""
    monkeypatch.setattr(weights, "AUTO_MIN_BYTES", 0)  # the tiny model counts as large
    d = _as_float32(save_tiny_model(tmp_path / "m", arch="qwen2", hidden=64))
    first = load_model(str(d), dtype=dtype, weights="auto")
    monkeypatch.setattr(loader, "_load_dir", lambda *a: pytest.fail("the float checkpoint was loaded"))
    lean = load_model(str(d), dtype=dtype, weights="auto")
    for lm in (first, lean):
        assert lm.weights == expected and lm.weights_reason.startswith(
            f"auto: {'a float32' if expected == 'w8a8' else 'int8'}"
        )
        q_proj = lm.model.model.layers[0].self_attn.q_proj
        assert type(q_proj) is (W8A8Linear if expected == "w8a8" else Int8Linear)


def test_fingerprint_from_the_file_equals_the_loaded_models(tmp_path):
    """The cache key computed before any weight is loaded (`read_ends`) is the loaded model's."""
    d = _as_float32(save_tiny_model(tmp_path / "m", arch="qwen2", hidden=64))
    full = load_model(str(d), dtype="bfloat16")
    shell = lean_load.skeleton(d, torch.bfloat16, None)
    stored = lean_load.checkpoint_tensors(d)
    assert all(stored[n][1] == tuple(p.shape) for n, p in shell.named_parameters())
    assert all(p.is_meta for p in shell.parameters())
    key = fingerprint(
        shell, full.tokenizer, ends=lambda n, p: lean_load.read_ends(stored[n][0], n, stored[n][1], p.dtype)
    )
    assert key == fingerprint(full.model, full.tokenizer)
    assert fingerprint(shell, full.tokenizer) != key  # without the samples it is another model's


def test_read_ends_samples_what_the_fingerprint_samples(tmp_path):
    value = torch.randn(10, 3)
    save_file({"w": value, "b": torch.randn(5)}, str(tmp_path / "t.safetensors"))
    ends = lean_load.read_ends(tmp_path / "t.safetensors", "w", (10, 3), torch.float32)
    flat = value.reshape(-1)
    assert torch.equal(ends, torch.cat([flat[:16], flat[-16:]]))


@needs_proc_maps
def test_a_float32_load_maps_an_owned_checkpoints_embedding_and_no_view_of_the_cache_remains(tmp_path):
    """A load in the checkpoint's dtype of a checkpoint cake-cli owns (under its models folder, replaced
    only by rename) maps the input embedding (a lookup once the tied head is quantized), maps the
    int8 weights its layers keep as stored over their own bytes, and copies everything else: the
    model equals the full load's, and no mapping of the whole cache file outlives the load. A
    checkpoint elsewhere (a user's, which may be rewritten in place) is read, never mapped."""
    owned = save_tiny_model(tmp_path / "cake-home" / "models" / "m", arch="qwen2", hidden=64, tie_word_embeddings=True)
    elsewhere = save_tiny_model(tmp_path / "user" / "m", arch="qwen2", hidden=64, tie_word_embeddings=True)
    for d in (_as_float32(owned), _as_float32(elsewhere)):
        full = load_model(str(d), dtype="float32", weights="int8")
        lean = load_model(str(d), dtype="float32", weights="int8")
        table = lean.model.get_input_embeddings().weight
        assert file_mapping(table) == ((d / "model.safetensors").resolve() if d == owned else None)
        cache = lean.model.model.layers[0].mlp.down_proj.qweight
        backing = file_mapping(cache)
        assert backing is not None and backing.name.startswith("int8-")  # kept as stored: mapped
        assert mapping_size(cache) <= cache.nbytes + 2 * 4096  # its own bytes (whole pages), not the file
        small = [t for n, t in _state(lean.model).items() if n.endswith(("bias", "norm.weight"))]
        assert small and all(file_mapping(t) is None for t in small)
        a, b = _state(full.model), _state(lean.model)
        for name in a:
            torch.testing.assert_close(b[name], a[name], rtol=0, atol=0, msg=name)
        ids = torch.randint(3, 400, (1, 9), generator=torch.Generator().manual_seed(1))
        torch.testing.assert_close(_logits(lean, ids), _logits(full, ids), rtol=0, atol=0)


def test_a_cache_that_fails_while_read_is_a_one_line_error_naming_it(tmp_path, monkeypatch):
    d = _as_float32(save_tiny_model(tmp_path / "m", arch="llama", hidden=64))
    load_model(str(d), dtype="float32", weights="int8")  # cached

    def broken(self, name):
        raise OSError("Input/output error")

    monkeypatch.setattr(tensor_files.CopiedTensors, "__getitem__", broken)
    with pytest.raises(CakeError, match="cannot read the quantized weights in .*int8-.*Input/output error") as e:
        load_model(str(d), dtype="float32", weights="int8")
    assert e.value.hint.startswith("delete ") and e.value.hint.endswith(" and run again")


def test_without_a_cache_or_with_other_names_it_declines(tmp_path):
    """No cached linear layers yet, or tensors named otherwise than the model's (a checkpoint
    transformers maps by its own rules): None, the skeleton untouched, and the ordinary load runs."""
    d = save_tiny_model(tmp_path / "m", arch="llama", hidden=64)
    tokenizer = load_model(str(d), dtype="bfloat16").tokenizer
    shell = lean_load.skeleton(d, torch.bfloat16, None)
    assert lean_load.load_cached(d, tokenizer, torch.bfloat16, "int8", shell) is None
    assert all(p.is_meta for p in shell.parameters())
    load_model(str(d), dtype="bfloat16", weights="int8")  # now cached
    assert lean_load.load_cached(d, tokenizer, torch.bfloat16, "int8", lean_load.skeleton(d, torch.bfloat16, None))
    renamed = tmp_path / "renamed"
    shutil.copytree(d, renamed)
    path = renamed / "model.safetensors"
    tensors = load_file(str(path))
    tensors["model.norm.scale"] = tensors.pop("model.norm.weight")
    save_file(tensors, str(path), metadata={"format": "pt"})
    shell = lean_load.skeleton(renamed, torch.bfloat16, None)
    assert lean_load.load_cached(renamed, tokenizer, torch.bfloat16, "int8", shell) is None
