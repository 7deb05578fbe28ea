"""keep_freed_pages: glibc's thresholds are set where glibc is the C library."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from hicache.daemon.heap import (
    MMAP_BYTES,
    TOP_PAD_BYTES,
    TRIM_BYTES,
    HeapSettings,
    keep_freed_pages,
)


def test_applies_on_glibc_in_a_fresh_process() -> None:
    # In a child, so the test process's allocator settings stay as they were.
    code = "from hicache.daemon.heap import keep_freed_pages; print(keep_freed_pages())"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    expected = (
        HeapSettings(True, MMAP_BYTES, TRIM_BYTES, TOP_PAD_BYTES)
        if glibc
        else HeapSettings(False, 0, 0)
    )
    assert out == repr(expected)


@pytest.mark.parametrize(("mmap_bytes", "trim_bytes"), [(0, 1), (1, 0), (-5, 10)])
def test_rejects_thresholds_below_one(mmap_bytes: int, trim_bytes: int) -> None:
    with pytest.raises(ValueError, match="thresholds"):
        keep_freed_pages(mmap_bytes, trim_bytes, 0)


@pytest.mark.parametrize("pad_bytes", [-1, 11])
def test_rejects_a_top_pad_outside_the_trim_threshold(pad_bytes: int) -> None:
    with pytest.raises(ValueError, match="top pad"):
        keep_freed_pages(10, 10, pad_bytes)


_BURST = """
import sys
from hicache.daemon.heap import keep_freed_pages
keep_freed_pages(32 << 20, 8 << 20, int(sys.argv[1]))
def rss_anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) << 10
base = rss_anon()
burst = [bytearray(1 << 20) for _ in range(24)]  # touched: 24 MiB of heap
del burst  # freed at once: the top of the heap is trimmed
print((rss_anon() - base) >> 20)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_a_burst_freed_at_once_keeps_the_top_pad_for_the_next_allocations() -> None:
    def kept_mib(pad: int) -> int:
        run = [sys.executable, "-c", _BURST, str(pad)]
        return int(subprocess.run(run, capture_output=True, text=True, check=True).stdout)

    assert kept_mib(4 << 20) >= 3  # trimmed back to the pad, not to nothing
    assert kept_mib(0) <= 1
