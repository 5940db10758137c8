"""`models.heap.release_freed_memory` returns freed heap pages to the OS (glibc)."""

from __future__ import annotations

import ctypes.util
import json
import subprocess
import sys

import pytest

# In a fresh interpreter (a long test process's heap is already shaped by what ran before), through
# the C allocator itself (Python's own small-object arenas are not in the brk heap, so Python objects
# cannot pin it): 100 KB blocks, touched, sit in the brk heap (below glibc's mmap threshold); a small
# block kept after each one stops the heap's top from shrinking by itself when they are freed.
SCENARIO = """
import ctypes, ctypes.util, json
from cake_cli.bench.memory import rss_bytes
from cake_cli.models.heap import release_freed_memory
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
big, keep = [], []
for _ in range(3000):
    block = libc.malloc(100_000)
    ctypes.memset(block, 1, 100_000)
    big.append(block)
    keep.append(libc.malloc(64))
before = rss_bytes()
for block in big:
    libc.free(block)
freed = rss_bytes()
trimmed = release_freed_memory()
print(json.dumps({"before": before, "freed": freed, "after": rss_bytes(), "trimmed": trimmed, "kept": len(keep)}))
"""


@pytest.mark.skipif(ctypes.util.find_library("c") is None, reason="no C library found")
def test_freed_heap_blocks_leave_the_resident_memory():
    out = subprocess.run([sys.executable, "-c", SCENARIO], capture_output=True, text=True, check=True)
    m = json.loads(out.stdout.strip().splitlines()[-1])
    assert m["trimmed"] and m["kept"] == 3000
    assert m["before"] - m["freed"] < 100 * 2**20, "the blocks left by themselves: the test would prove nothing"
    assert m["freed"] - m["after"] > 200 * 2**20
