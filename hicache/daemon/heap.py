"""keep_freed_pages: glibc malloc settings that keep freed page buffers for reuse.

Every PUT moves each page through several large buffers (the received ZeroMQ
frame, the LMDB page record, LMDB's dirty pages). With glibc's defaults a
freed buffer of a megabyte or so is handed back to the kernel (``munmap``, or
``madvise`` when the top of a heap is trimmed), so the next request faults
in and zeroes fresh pages: measured at about a fifth of a PUT's time in the
daemon. Fixed thresholds keep such buffers inside the process for the next
request instead. The memory tier keeps PUTs' received frames, so a burst of
them freed at once (a DELETE of many pages) leaves free space at the top of
the heap: once that reaches ``TRIM_BYTES`` it is given back down to
``TOP_PAD_BYTES``, not to nothing, so the next PUTs of that size reuse it
(without the pad, a bench round of 64 MiB PUT, read and deleted faulted in all
of its receive memory again every round: ZeroMQ's I/O thread 0.5-0.8 s/GiB of
CPU instead of 0.2-0.35). Memory stays bounded: at most ``TRIM_BYTES`` of free
space is kept at the top of the malloc arena, on top of what the daemon's own
bounds (in-flight writes, reply budgets, memory tier) allow. There is one
arena: page buffers are Python objects allocated under the GIL, so an arena
per reader thread would buy no parallelism, only free space kept per thread
(measured: the reply-budget test's growth doubled with four readers).
"""

from __future__ import annotations

import ctypes
import logging
import sys
from typing import NamedTuple

logger = logging.getLogger(__name__)

# mallopt parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

# Buffers up to this size come from the heap (the ceiling glibc's own sliding threshold
# has on 64-bit), so pages up to 32 MiB are recycled rather than mapped and unmapped.
MMAP_BYTES = 32 << 20
# Free space kept at the top of each arena before it is given back to the kernel ...
TRIM_BYTES = 128 << 20
# ... and what is kept there when it is (the heap also grows by this much at a time).
TOP_PAD_BYTES = 64 << 20


class HeapSettings(NamedTuple):
    """What ``keep_freed_pages`` applied; ``applied`` False off glibc (nothing changed)."""

    applied: bool
    mmap_threshold: int
    trim_threshold: int
    top_pad: int = 0


def keep_freed_pages(
    mmap_bytes: int = MMAP_BYTES, trim_bytes: int = TRIM_BYTES, pad_bytes: int = TOP_PAD_BYTES
) -> HeapSettings:
    """Set glibc's mmap and trim thresholds, its top pad and one arena for this process
    (process-wide, all threads; call it before starting threads).

    Mutates the C allocator's settings only; a no-op (``applied`` False) on a C
    library without ``mallopt`` or that refuses a value. Raises ValueError for
    thresholds below 1 or a pad outside 0..``trim_bytes``.
    """
    if mmap_bytes < 1 or trim_bytes < 1:
        raise ValueError(f"thresholds must be >= 1, got {mmap_bytes} and {trim_bytes}")
    if not 0 <= pad_bytes <= trim_bytes:
        raise ValueError(f"the top pad must be within 0..{trim_bytes}, got {pad_bytes}")
    off = HeapSettings(False, 0, 0)
    if not sys.platform.startswith("linux"):
        return off
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl's mallopt does nothing
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return off
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    if mallopt(_M_MMAP_THRESHOLD, mmap_bytes) != 1 or mallopt(_M_TRIM_THRESHOLD, trim_bytes) != 1:
        logger.warning("glibc refused the malloc thresholds; freed pages go back to the kernel")
        return off
    if mallopt(_M_TOP_PAD, pad_bytes) != 1:
        logger.warning("glibc refused the top pad; a burst of freed pages goes back whole")
        pad_bytes = 0
    if mallopt(_M_ARENA_MAX, 1) != 1:  # before the reader threads start
        logger.warning("glibc refused one malloc arena; each thread may keep its free space")
    return HeapSettings(True, mmap_bytes, trim_bytes, pad_bytes)
