"""The lean conversion: a GGUF written straight into the int8/int4 weights the CPU runs, and loaded by mapping.

Oracles: the float path (the GGUF converted to a float32 checkpoint, then quantized by
`quantize.quantize_int8`), which a float32 lean model must match exactly; gguf-py's dequantization
of the whole GGUF tensor in float64, which every stored int8 code must round to; the tiny model's
own logits. The GGUFs are tiny random qwen2 models whose matrices gguf-py quantizes (Q8_0, Q5_0).
"""

from __future__ import annotations

import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize, quantize
from safetensors import safe_open

from cake_cli.errors import CakeError
from cake_cli.models import checkpoints, lean_gguf
from cake_cli.models import gguf as conversion
from cake_cli.models.block_embedding import BlockEmbedding
from cake_cli.models.gguf_tensors import read_gguf
from cake_cli.models.loader import load_model
from cake_cli.models.quantize import Int8Linear, quantize_int8, w8a8_available
from cake_cli.models.tensor_writer import TensorWriter
from cake_cli.paths import models_dir
from tests.helpers.tiny import save_tiny_gguf, save_tiny_model

IDS = (5, 6, 7, 100, 200, 3, 42, 17, 250, 9, 64, 65)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.setenv("CAKE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for var in ("CAKE_MODEL", "CAKE_PROFILES_DIR"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module", params=["Q8_0", "Q5_0"])
def q_gguf(request, tmp_path_factory) -> tuple[Path, Path]:
    """(a GGUF whose matrices are in that GGML type, the float model it was made from)."""
    return save_tiny_gguf(tmp_path_factory.mktemp("gguf") / f"tiny-{request.param}.gguf", kind=request.param)


def logits(lm, ids=IDS) -> torch.Tensor:
    with torch.no_grad():
        return lm.model(torch.tensor([ids])).logits.float()


def float_path_int8(gguf: Path, dtype: str):
    """The oracle: the GGUF's float32 checkpoint quantized by the float path (`weight_cache`)."""
    return load_model(str(conversion.ensure_converted(gguf)), dtype=dtype, weights="int8")


def test_lean_int8_computes_exactly_what_the_float_path_int8_computes_in_float32(q_gguf):
    gguf, _ = q_gguf
    lean = load_model(str(gguf), dtype="float32", weights="int8")
    assert lean.weights == "int8" and lean.path == conversion.file_origin(gguf).lean_dir
    assert isinstance(lean.model.model.embed_tokens, BlockEmbedding)
    old = float_path_int8(gguf, "float32")
    torch.testing.assert_close(logits(lean), logits(old), rtol=0, atol=0)  # prefill: dequantized weights
    torch.testing.assert_close(logits(lean, IDS[:3]), logits(old, IDS[:3]), rtol=0, atol=0)  # the fused kernel


def test_every_int8_code_rounds_the_float64_dequantized_gguf_tensor(q_gguf):
    gguf, _ = q_gguf
    lean = load_model(str(gguf), dtype="float32", weights="int8")
    reader = GGUFReader(str(gguf))
    stored = {t.name: t for t in reader.tensors}
    checked = 0
    with safe_open(str(lean.path / "int8.safetensors"), "pt") as f:
        for name, module in lean.model.named_modules():
            if not isinstance(module, Int8Linear):
                continue
            t = stored[_gguf_name_of(name)]
            reference = torch.from_numpy(dequantize(t.data, t.tensor_type).astype(np.float64))  # [N, K]
            scales = f.get_tensor(f"{name}.scales").double()  # float32 as stored ([N])
            torch.testing.assert_close(scales, reference.abs().amax(dim=1) / 127, rtol=1e-6, atol=0)
            codes = f.get_tensor(f"{name}.qweight").double()
            assert torch.equal(codes, module.qweight.double())  # what the layer multiplies by
            assert (codes - reference / scales[:, None]).abs().max() <= 0.5 + 1e-5  # the nearest code
            checked += 1
    assert checked == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer, and the output head


def _gguf_name_of(module: str) -> str:
    if module == "lm_head":
        return "output.weight"
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}  # fmt: skip
    _, _, index, rest = module.split(".", 3)
    return f"blk.{index}.{names[rest]}.weight"


def test_bf16_lean_stays_within_bf16_rounding_of_the_float32_lean_model(q_gguf):
    """On a bf16 model the lean path quantizes the float32 weights where the float path quantized
    their bf16 rounding: the stated tolerance is bf16's, against the float32 lean model."""
    gguf, _ = q_gguf
    exact = logits(load_model(str(gguf), dtype="float32", weights="int8"))
    lean = logits(load_model(str(gguf), dtype="bfloat16", weights="int8"))
    old = logits(float_path_int8(gguf, "bfloat16"))
    spread = exact.abs().max()
    assert (lean - exact).abs().max() <= 0.05 * spread
    assert (lean - exact).abs().mean() <= 1.5 * (old - exact).abs().mean() + 1e-3


def test_the_lean_folder_holds_only_what_runs(q_gguf):
    gguf, _ = q_gguf
    scheme = "w8a8" if w8a8_available() else "int8"  # w8a8 reads int8's file
    lean = load_model(str(gguf), dtype="float32", weights=scheme)
    folder = lean.path
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted(
        ["chat_template.jinja", "config.json", "generation_config.json", "int8.safetensors", "tokenizer.json",
         "tokenizer_config.json", checkpoints.MARKER]
    )  # fmt: skip
    assert not list(models_dir().rglob("model.safetensors"))  # no float checkpoint was written
    assert checkpoints.read_marker(folder)["layout"] == "lean"
    with safe_open(str(folder / "int8.safetensors"), "pt") as f:
        meta = f.metadata()
        blocks = f.get_tensor("model.embed_tokens.blocks")
    assert meta["embedding"] == gguf.stem.split("-")[1] and blocks.dtype == torch.uint8
    assert (folder / "int8.safetensors").stat().st_size < gguf.stat().st_size * 2


def test_a_second_load_maps_the_file_without_converting(q_gguf, monkeypatch):
    gguf, _ = q_gguf
    first = load_model(str(gguf), dtype="float32", weights="int8")
    monkeypatch.setattr(lean_gguf, "convert_weights", lambda *a, **k: pytest.fail("converted again"))
    monkeypatch.setattr(lean_gguf, "write_base", lambda *a, **k: pytest.fail("converted again"))
    messages = []
    second = load_model(str(gguf), dtype="float32", weights="int8", progress=messages.append)
    assert any(m.startswith("int8 weights mapped from") for m in messages)
    torch.testing.assert_close(logits(second), logits(first), rtol=0, atol=0)
    qweight = second.model.model.layers[0].mlp.up_proj.qweight
    assert not qweight.untyped_storage().resizable()  # a view of the file's mapping, not a copy


def test_auto_on_a_model_too_small_to_quantize_converts_the_float_checkpoint_only(q_gguf):
    gguf, _ = q_gguf
    lm = load_model(str(gguf), dtype="float32")  # auto: the tiny model's weights fit the CPU caches
    assert lm.weights == "bf16" and (lm.path / "model.safetensors").is_file()
    lean = conversion.file_origin(gguf).lean_dir
    assert not (lean / "int8.safetensors").exists()  # the lean folder holds config and tokenizer only


def test_int4_fits_from_the_gguf_through_the_int8_calibration(q_gguf):
    gguf, model_dir = q_gguf
    lm = load_model(str(gguf), dtype="float32", weights="int4")
    folder = lm.path
    assert (folder / "int4.safetensors").is_file() and (folder / "int8.safetensors").is_file()
    int8 = logits(load_model(str(gguf), dtype="float32", weights="int8"))
    int4 = logits(lm)
    assert (int4 - int8).abs().mean() <= 0.2 * int8.abs().mean()
    assert (int4.argmax(-1) == int8.argmax(-1)).float().mean() >= 0.5


def test_an_earlier_float_checkpoint_is_removed_once_with_one_line(q_gguf):
    gguf, _ = q_gguf
    old = conversion.ensure_converted(gguf)
    marker = checkpoints.read_marker(old)
    del marker["on_demand"]  # as cake-cli wrote it before lean folders
    (old / checkpoints.MARKER).write_text(json.dumps(marker))
    (old / "cake-weights").mkdir()
    (old / "cake-weights" / "int8-old.safetensors").write_bytes(b"\0" * 1000)
    messages = []
    load_model(str(gguf), dtype="float32", weights="int8", progress=messages.append)
    removed = [m for m in messages if m.startswith("removed the float32 checkpoint")]
    assert len(removed) == 1 and str(old) in removed[0] and "GB freed" in removed[0]
    assert not old.exists()
    again = load_model(str(gguf), dtype="float32", weights="bf16")  # asked for: converted, and kept
    assert again.path == old and old.is_dir()
    load_model(str(gguf), dtype="float32", weights="int8")
    assert old.is_dir()


def test_an_interrupted_conversion_leaves_nothing_behind(q_gguf, monkeypatch):
    gguf, _ = q_gguf

    def full_disk(*_a, **_k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(lean_gguf, "convert_weights", full_disk)
    with pytest.raises(CakeError) as e:
        load_model(str(gguf), dtype="float32", weights="int8")
    assert "No space left on device" in e.value.message and "free" in e.value.hint
    lean = conversion.file_origin(gguf).lean_dir
    assert not lean.exists() and [p.name for p in lean.parent.iterdir() if p.name != "gguf"] == []


def test_a_family_with_a_scaled_embedding_loads_the_float_way(tmp_path):
    from cake_cli.models import lean_load

    d = save_tiny_model(tmp_path / "gemma", arch="gemma3_text", layers=2)
    reason = lean_gguf.supports(lean_load.skeleton(d, torch.float32, None))
    assert reason is not None and "not a plain lookup" in reason
    qwen = save_tiny_model(tmp_path / "qwen", arch="qwen2", layers=2)
    assert lean_gguf.supports(lean_load.skeleton(qwen, torch.float32, None)) is None


# --------------------------------------------------------------------------- the pieces


@pytest.mark.parametrize("kind", ["Q8_0", "Q5_0", "Q4_1", "F16", "F32"])
def test_block_embedding_rows_decode_as_the_whole_table(kind):
    rng = np.random.default_rng(0)
    table = rng.standard_normal((50, 64)).astype(np.float32)
    qtype = GGMLQuantizationType[kind]
    stored = table.copy() if kind == "F32" else quantize(table, qtype)
    blocks = torch.from_numpy(np.ascontiguousarray(stored).view(np.uint8).reshape(50, -1).copy())
    whole = torch.from_numpy(dequantize(np.ascontiguousarray(stored), qtype).copy())  # [50, 64]
    emb = BlockEmbedding(blocks, kind, 64, torch.float32)
    ids = torch.tensor([[3, 3, 49, 0], [7, 8, 3, 1]])
    torch.testing.assert_close(emb(ids), whole[ids], rtol=0, atol=0)
    assert emb(ids).shape == (2, 4, 64) and emb.weight.dtype == torch.uint8
    assert BlockEmbedding(blocks, kind, 64, torch.bfloat16)(ids).dtype == torch.bfloat16
    with pytest.raises(IndexError):
        emb(torch.tensor([50]))
    with pytest.raises(ValueError, match="do not hold"):
        BlockEmbedding(blocks, kind, 32, torch.float32)


def test_tensor_writer_round_trips_tensors_written_in_any_order_and_in_row_blocks(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "a.qweight": torch.randint(-127, 128, (37, 16), dtype=torch.int8, generator=g),
        "a.scales": torch.rand(37, generator=g),
        "b.blocks": torch.randint(0, 256, (5, 3), dtype=torch.uint8, generator=g),
        "norm": torch.rand(16, generator=g).double(),
        "scalar": torch.tensor(3.5),
    }
    path = tmp_path / "x.safetensors"
    with TensorWriter(path, {n: (t.dtype, tuple(t.shape)) for n, t in tensors.items()}, {"k": "v"}) as w:
        w.write("scalar", tensors["scalar"])
        w.write("a.qweight", tensors["a.qweight"][20:], row=20)
        w.write("norm", tensors["norm"])
        w.write("a.qweight", tensors["a.qweight"][:20])
        with pytest.raises(KeyError):
            w.write("norm", tensors["norm"])
        with pytest.raises(ValueError, match="does not fit"):
            w.write("a.scales", tensors["a.scales"].double())
        w.write("a.scales", tensors["a.scales"])
        w.write("b.blocks", tensors["b.blocks"])
        assert not path.exists()  # only once finished
        w.finish()
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"k": "v"}
        for name, t in tensors.items():
            torch.testing.assert_close(f.get_tensor(name), t, rtol=0, atol=0)
    assert [p.name for p in tmp_path.iterdir()] == ["x.safetensors"]


def test_tensor_writer_leaves_no_file_when_a_tensor_is_missing_or_it_fails(tmp_path):
    path = tmp_path / "y.safetensors"
    w = TensorWriter(path, {"a": (torch.float32, (4,)), "b": (torch.int8, (2, 2))}, {})
    w.write("a", torch.zeros(4))
    with pytest.raises(ValueError, match="never written"):
        w.finish()
    with pytest.raises(RuntimeError), TensorWriter(path, {"a": (torch.float32, (4,))}, {}) as w2:
        w2.write("a", torch.zeros(4))
        raise RuntimeError("interrupted")
    assert os.listdir(tmp_path) == []


def test_quantize_int8_of_rows_equals_quantize_int8_of_the_whole():
    """The output head is quantized a block of rows at a time: the same codes and scales as whole."""
    w = torch.randn(300, 64, generator=torch.Generator().manual_seed(1))
    q, s = quantize_int8(w)
    parts = [quantize_int8(w[i : i + 128]) for i in range(0, 300, 128)]
    assert torch.equal(torch.cat([p[0] for p in parts]), q) and torch.equal(torch.cat([p[1] for p in parts]), s)


def test_the_plain_mapping_parse_reads_what_gguf_py_reads(q_gguf):
    """`read_gguf` (a plain array over the mapping) against gguf-py's own ``np.memmap`` reader: the
    same fields with the same values, the same tensors with the same bytes."""
    gguf, _ = q_gguf
    fast, slow = read_gguf(gguf), GGUFReader(str(gguf))
    assert type(fast.data) is np.ndarray and isinstance(slow.data, np.memmap)
    assert list(fast.fields) == list(slow.fields)
    for key, field in fast.fields.items():
        assert field.types == slow.fields[key].types
        assert np.array_equal(np.concatenate(field.parts), np.concatenate(slow.fields[key].parts)), key
    assert [(t.name, t.tensor_type, t.data_offset) for t in fast.tensors] == [
        (t.name, t.tensor_type, t.data_offset) for t in slow.tensors
    ]
    for a, b in zip(fast.tensors, slow.tensors):
        assert np.array_equal(np.asarray(a.data), np.asarray(b.data)), a.name
    assert type(GGUFReader(str(gguf)).data) is np.memmap


def test_the_plain_mapping_parse_refuses_an_empty_or_foreign_file(tmp_path):
    (tmp_path / "empty.gguf").write_bytes(b"")
    (tmp_path / "text.gguf").write_bytes(b"not a gguf file at all")
    for name in ("empty.gguf", "text.gguf"):
        with pytest.raises(ValueError):
            read_gguf(tmp_path / name)


def test_conversion_steps_come_back_in_order_with_few_in_flight():
    """`_ahead` hands results out in submission order and never runs more than depth + 1 ahead."""
    started, handed, lock = [], [], threading.Lock()

    def job(i):
        with lock:
            started.append(i)
            assert len(started) - len(handed) <= 3, "too many steps in flight"
        return i * i

    with ThreadPoolExecutor(2) as pool:
        for value in lean_gguf._ahead(pool, [lambda i=i: job(i) for i in range(40)], depth=2):
            handed.append(value)
    assert handed == [i * i for i in range(40)]
