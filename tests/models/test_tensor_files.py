"""`models.tensor_files`: tensors copied out of a file (nothing of it left resident), or mapped over
their own bytes only (only the rows read become resident; writes never reach the file)."""

from __future__ import annotations

import json
import os
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from cake_cli.models import tensor_files
from cake_cli.models.tensor_files import CopiedTensors, entries, mapped, read_rows
from tests.helpers.mappings import file_mapping, mapped_paths, mapping_size, needs_proc_maps, resident_bytes


def _data_start(path) -> int:
    (size,) = struct.unpack("<Q", path.read_bytes()[:8])
    return 8 + size


def _overwrite_data(path, value: float) -> None:
    """Overwrite every data byte of safetensors file `path` in place (same inode): a view of a mapping
    of it would see the new bytes, a copy keeps the old ones."""
    start = _data_start(path)
    size = path.stat().st_size - start
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(struct.pack("<f", value) * (size // 4))


def _hand_made(path, meta: dict, data: bytes) -> None:
    """A safetensors file written byte by byte (layouts the library would not write)."""
    raw = json.dumps(meta).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def _stored(g: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        "a.qweight": torch.randint(-127, 128, (64, 32), dtype=torch.int8, generator=g),
        "a.scales": torch.rand(64, generator=g),
        "b.nibbles": torch.randint(0, 255, (16, 8), dtype=torch.uint8, generator=g),
        "b.scale_zero": torch.rand(4, 16, 2, generator=g).to(torch.bfloat16),
        "c.ids": torch.arange(5),
    }


def test_read_rows_reads_in_slices_and_casts_like_to(tmp_path, monkeypatch):
    monkeypatch.setattr(tensor_files, "CHUNK_BYTES", 40)  # 3 rows of 3 float32 per mapping: 4 slices of 10 rows
    value = torch.randn(10, 3)
    save_file({"w": value, "b": torch.randn(5), "s": torch.tensor(2.5)}, str(tmp_path / "t.safetensors"))
    got = read_rows(tmp_path / "t.safetensors", "w", (10, 3), torch.bfloat16)
    assert torch.equal(got, value.to(torch.bfloat16))
    scalar = read_rows(tmp_path / "t.safetensors", "s", (), torch.float32)
    _overwrite_data(tmp_path / "t.safetensors", 7.0)
    assert scalar.item() == 2.5 and torch.equal(got, value.to(torch.bfloat16))  # copies, not views


def test_entries_read_the_header_as_safetensors_writes_it(tmp_path):
    path = tmp_path / "t.safetensors"
    stored = _stored(torch.Generator().manual_seed(0))
    save_file(stored, str(path), metadata={"scheme": "int8"})
    fd = os.open(path, os.O_RDONLY)
    try:
        found, metadata = entries(fd)
    finally:
        os.close(fd)
    assert metadata == {"scheme": "int8"} and found.keys() == stored.keys()
    raw = path.read_bytes()
    for name, value in stored.items():
        e = found[name]
        assert e.dtype == value.dtype and e.shape == tuple(value.shape)
        assert raw[e.begin : e.end] == value.contiguous().view(torch.uint8).numpy().tobytes(), name


@needs_proc_maps
def test_copied_tensors_equal_the_files_and_keep_no_view_of_it(tmp_path):
    path = tmp_path / "t.safetensors"
    stored = _stored(torch.Generator().manual_seed(0))
    save_file(stored, str(path))
    copied = CopiedTensors(path)
    assert set(copied) == set(stored) and len(copied) == 5 and "a.scales" in copied and "x" not in copied
    got = {name: copied[name] for name in copied}
    assert path.resolve() not in mapped_paths()
    for name, value in stored.items():
        assert got[name].dtype == value.dtype and torch.equal(got[name], value), name
    views = load_file(str(path))  # what safetensors hands back
    if file_mapping(views["a.scales"]) != path.resolve():
        pytest.skip("this safetensors copies on load: nothing to compare against")
    _overwrite_data(path, 3.0)
    assert torch.equal(got["a.scales"], stored["a.scales"])
    assert torch.all(views["a.scales"] == 3.0)  # the view reads the overwritten file, the copy does not
    with pytest.raises(KeyError):
        copied["c.qweight"]


@needs_proc_maps
def test_kept_tensors_are_mapped_over_their_own_bytes(tmp_path):
    path = tmp_path / "t.safetensors"
    big = torch.randint(-127, 128, (4096, 1024), dtype=torch.int8, generator=torch.Generator().manual_seed(1))
    save_file({"a.qweight": big, "b.qweight": big.flip(0), "a.scales": torch.rand(4096)}, str(path))
    copied = CopiedTensors(path, frozenset({"a.qweight"}))
    kept, other = copied["a.qweight"], copied["b.qweight"]
    assert torch.equal(kept, big) and torch.equal(other, big.flip(0))
    assert file_mapping(kept) == path.resolve() and file_mapping(other) is None
    assert mapping_size(kept) <= big.numel() + 4096  # its 4 MiB (and the page below), not the 8 MiB file
    kept[0, 0] = 5  # a private mapping: the process's own copy of that page
    assert torch.equal(load_file(str(path))["a.qweight"][0], big[0])


def test_copied_tensors_read_the_file_they_checked_even_when_one_is_renamed_over_it(tmp_path):
    path, other = tmp_path / "t.safetensors", tmp_path / "new.safetensors"
    save_file({"w": torch.ones(8)}, str(path), metadata={"v": "1"})
    copied = CopiedTensors(path)
    save_file({"w": torch.zeros(8), "x": torch.zeros(2)}, str(other), metadata={"v": "2"})
    other.replace(path)  # as `files.write_atomic` replaces a cache file
    assert copied.metadata == {"v": "1"} and torch.equal(copied["w"], torch.ones(8))
    assert CopiedTensors(path).metadata == {"v": "2"}


def test_a_file_shorter_than_its_header_says_is_refused(tmp_path):
    path = tmp_path / "t.safetensors"
    save_file({"w": torch.ones(64)}, str(path))
    path.write_bytes(path.read_bytes()[:-16])
    with pytest.raises(ValueError, match="outside the file"):
        CopiedTensors(path)


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
    # that maps large folios whole, as some do for a file just written) and the fault-around, of 64 MiB
    assert resident_bytes(path) < 16 * 2**20
    assert torch.equal(got, reference)  # every row now read
    assert resident_bytes(path) >= 32 * 2**20
    got[0, 0] = 1e6  # a private mapping: the process's own copy of that page
    assert torch.equal(load_file(str(path))["embed"][0], reference[0])


def test_mapped_declines_what_it_cannot_map_without_a_cast(tmp_path):
    path = tmp_path / "t.safetensors"
    save_file({"embed": torch.randn(4, 8), "ids": torch.arange(3), "none": torch.empty(0, 4)}, str(path))
    assert mapped(path, "embed", torch.bfloat16) is None  # stored float32: the caller reads and casts
    assert mapped(path, "missing", torch.float32) is None
    assert mapped(path, "none", torch.float32) is None  # nothing to map
    assert torch.equal(mapped(path, "ids", torch.int64), torch.arange(3))
    # a float32 tensor starting 1 byte into the data (the format allows it): not mapped misaligned
    odd = tmp_path / "odd.safetensors"
    meta = {
        "pad": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
        "w": {"dtype": "F32", "shape": [4], "data_offsets": [1, 17]},
    }
    _hand_made(odd, meta, bytes(1) + struct.pack("<4f", 1, 2, 3, 4))
    assert mapped(odd, "w", torch.float32) is None
    assert load_file(str(odd))["w"].tolist() == [1, 2, 3, 4]  # a valid file, read the ordinary way
    assert CopiedTensors(odd)["w"].tolist() == [1, 2, 3, 4]  # copies need no alignment
    broken = tmp_path / "broken.safetensors"
    _hand_made(broken, {"w": {"dtype": "F32", "shape": [4]}}, bytes(16))  # no data_offsets
    assert mapped(broken, "w", torch.float32) is None  # safetensors itself then names the problem


@pytest.mark.parametrize(
    "raw,message",
    [
        (b"abc", "too short"),
        (struct.pack("<Q", 2**40) + b"{}", "not a safetensors file"),
        (struct.pack("<Q", 8) + b"{not js}", "unreadable safetensors header"),
        (struct.pack("<Q", 8) + b'{"w": 1}', "unreadable safetensors header"),
    ],
)
def test_entries_refuse_what_is_not_safetensors(tmp_path, raw, message):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(raw)
    with pytest.raises(ValueError, match=message):
        CopiedTensors(path)
