"""`models.tensor_files`: tensors copied out of short-lived mappings (nothing of the file stays
resident) or mapped privately (only the rows read become resident; writes never reach the file)."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from cake_cli.models import tensor_files
from cake_cli.models.tensor_files import CopiedTensors, header, mapped, read_rows
from tests.helpers.mappings import file_mapping, mapped_paths, needs_proc_maps, resident_bytes


def _overwrite_data(path, value: float) -> None:
    """Overwrite every data byte of safetensors file `path` in place (same inode): a view of a mapping
    of it would see the new bytes, a copy keeps the old ones."""
    start, _ = header(path)
    size = path.stat().st_size - start
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(struct.pack("<f", value) * (size // 4))


def test_read_rows_reads_in_slices_and_casts_like_to(tmp_path, monkeypatch):
    monkeypatch.setattr(tensor_files, "CHUNK_BYTES", 40)  # 3 rows of 3 float32 per mapping: 4 slices of 10 rows
    value = torch.randn(10, 3)
    save_file({"w": value, "b": torch.randn(5), "s": torch.tensor(2.5)}, str(tmp_path / "t.safetensors"))
    got = read_rows(tmp_path / "t.safetensors", "w", (10, 3), torch.bfloat16)
    assert torch.equal(got, value.to(torch.bfloat16))
    scalar = read_rows(tmp_path / "t.safetensors", "s", (), torch.float32)
    _overwrite_data(tmp_path / "t.safetensors", 7.0)
    assert scalar.item() == 2.5 and torch.equal(got, value.to(torch.bfloat16))  # copies, not views


@needs_proc_maps
def test_copied_tensors_equal_the_files_and_outlive_no_mapping(tmp_path):
    path = tmp_path / "t.safetensors"
    g = torch.Generator().manual_seed(0)
    stored = {
        "a.qweight": torch.randint(-127, 128, (64, 32), dtype=torch.int8, generator=g),
        "a.scales": torch.rand(64, generator=g),
        "b.nibbles": torch.randint(0, 255, (16, 8), dtype=torch.uint8, generator=g),
        "b.scale_zero": torch.rand(4, 16, 2, generator=g).to(torch.bfloat16),
    }
    save_file(stored, str(path))
    copied = CopiedTensors(path)
    assert set(copied) == set(stored) and len(copied) == 4
    got = {name: copied[name] for name in copied}
    assert path.resolve() not in mapped_paths()
    for name, value in stored.items():
        assert got[name].dtype == value.dtype and torch.equal(got[name], value), name
    views = load_file(str(path))  # what safetensors hands back: views of a mapping of the file
    assert file_mapping(views["a.scales"]) == path.resolve()
    _overwrite_data(path, 3.0)
    assert torch.equal(got["a.scales"], stored["a.scales"])
    assert torch.all(views["a.scales"] == 3.0)  # the view reads the overwritten file, the copy does not
    with pytest.raises(KeyError):
        copied["c.qweight"]


@needs_proc_maps
def test_a_mapped_table_is_the_files_and_only_rows_read_become_resident(tmp_path):
    path = tmp_path / "t.safetensors"
    table = torch.randn(16384, 1024, generator=torch.Generator().manual_seed(0))  # 64 MiB
    save_file({"embed": table, "bias": torch.randn(7)}, str(path))
    del table
    reference = load_file(str(path))["embed"].clone()
    got = mapped(path, "embed", torch.float32)
    assert got.shape == (16384, 1024) and file_mapping(got) == path.resolve()
    rows = torch.tensor([5, 8000, 16000])
    assert torch.equal(torch.nn.functional.embedding(rows, got), reference[rows])
    # three 4 KiB rows read: at most the page-cache folios holding them (up to 2 MiB each on a kernel
    # with large folios) and the kernel's fault-around, of 64 MiB
    assert resident_bytes(path) < 16 * 2**20
    assert torch.equal(got, reference)  # every row now read
    assert resident_bytes(path) >= 64 * 2**20
    got[0, 0] = 1e6  # a private mapping: the process's own copy of that page
    assert torch.equal(load_file(str(path))["embed"][0], reference[0])


def test_mapped_declines_what_it_cannot_map_without_a_cast(tmp_path):
    path = tmp_path / "t.safetensors"
    save_file({"embed": torch.randn(4, 8), "ids": torch.arange(3)}, str(path))
    assert mapped(path, "embed", torch.bfloat16) is None  # stored float32: the caller reads and casts
    assert mapped(path, "missing", torch.float32) is None
    assert mapped(path, "ids", torch.int64) is not None
    # a float32 tensor starting 1 byte into the data (the format allows it): not mapped misaligned
    meta = {
        "pad": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
        "w": {"dtype": "F32", "shape": [4], "data_offsets": [1, 17]},
    }
    raw = json.dumps(meta).encode()
    raw += b" " * (-len(raw) % 8)
    odd = tmp_path / "odd.safetensors"
    odd.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(1) + struct.pack("<4f", 1, 2, 3, 4))
    assert mapped(odd, "w", torch.float32) is None
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(struct.pack("<Q", 8) + b"{not js}")
    assert mapped(broken, "w", torch.float32) is None  # safetensors itself then names the problem
    assert load_file(str(odd))["w"].tolist() == [1, 2, 3, 4]  # a valid file, read the ordinary way


def test_header_refuses_what_is_not_safetensors(tmp_path):
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"abc")
    with pytest.raises(ValueError, match="too short"):
        header(short)
    huge = tmp_path / "huge.safetensors"
    huge.write_bytes(struct.pack("<Q", 2**40) + b"{}")
    with pytest.raises(ValueError, match="not a safetensors file"):
        header(huge)
