"""`models.heap.release_freed_memory` returns freed heap pages to the OS (glibc)."""

from __future__ import annotations

import ctypes.util

import pytest

from cake_cli.bench.memory import rss_bytes
from cake_cli.models.heap import release_freed_memory


@pytest.mark.skipif(ctypes.util.find_library("c") is None, reason="no C library found")
def test_freed_heap_blocks_leave_the_resident_memory():
    # 100 KB blocks sit in the brk heap (below glibc's mmap threshold); a small block kept after each
    # one stops the heap's top from shrinking by itself when they are freed
    big, keep = [], []
    for _ in range(3000):
        big.append(bytearray(100_000))
        keep.append(bytearray(64))
    before = rss_bytes()
    del big
    freed = rss_bytes()
    assert release_freed_memory()
    after = rss_bytes()
    assert before - freed < 100 * 2**20, "the blocks left by themselves: the test would prove nothing"
    assert freed - after > 200 * 2**20
    assert len(keep) == 3000
