"""keep_freed_pages: glibc's thresholds are set where glibc is the C library."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from hicache.daemon.heap import MMAP_BYTES, TRIM_BYTES, HeapSettings, keep_freed_pages


def test_applies_on_glibc_in_a_fresh_process() -> None:
    # In a child, so the test process's allocator settings stay as they were.
    code = "from hicache.daemon.heap import keep_freed_pages; print(keep_freed_pages())"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    expected = HeapSettings(True, MMAP_BYTES, TRIM_BYTES) if glibc else HeapSettings(False, 0, 0)
    assert out == repr(expected)


@pytest.mark.parametrize(("mmap_bytes", "trim_bytes"), [(0, 1), (1, 0), (-5, 10)])
def test_rejects_thresholds_below_one(mmap_bytes: int, trim_bytes: int) -> None:
    with pytest.raises(ValueError, match="thresholds"):
        keep_freed_pages(mmap_bytes, trim_bytes)
