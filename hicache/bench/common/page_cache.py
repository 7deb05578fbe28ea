"""Drop a store's files from the OS page cache, and measure whether it worked.

A "cold store" read must come from the disk, not from pages the kernel kept
after the writes. ``posix_fadvise(POSIX_FADV_DONTNEED)`` asks the kernel to
drop a file's clean, unmapped pages (dirty pages are flushed first here);
whether it did depends on the file system (tmpfs and some overlay set-ups
keep everything) and on other processes mapping the file. ``mincore`` over a
fresh mapping counts the resident pages before and after, so a benchmark can
say whether its cold case really was cold. Linux only; elsewhere the counts
are None and the drop reports that it did not take effect.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

logger = logging.getLogger(__name__)

# A drop took effect when at most this share of the bytes stayed resident.
RESIDENT_TOLERANCE = 0.01


class DropResult(NamedTuple):
    files: int
    nbytes: int
    resident_before: int | None  # bytes in the page cache, None if unknown
    resident_after: int | None
    took_effect: bool


def resident_bytes(path: Path) -> int | None:
    """Bytes of ``path`` in the page cache now (mapping it faults nothing in)."""
    size = path.stat().st_size
    if size == 0:
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        c_int = ctypes.c_int
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, c_int, c_int, c_int, ctypes.c_long]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    except (OSError, AttributeError) as exc:
        logger.debug("no mincore here: %s", exc)
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            return None
        try:
            vec = np.zeros(-(-size // mmap.PAGESIZE), dtype=np.uint8)
            if libc.mincore(addr, size, vec.ctypes.data) != 0:
                return None
            return int((vec & 1).sum()) * mmap.PAGESIZE
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def drop_page_cache(root: Path) -> DropResult:
    """fsync and ``POSIX_FADV_DONTNEED`` every regular file under ``root``.

    Mutates only the page cache. Never raises for a file that vanished or a
    platform without fadvise: the result then says it did not take effect.
    """
    files = [p for p in sorted(root.rglob("*")) if p.is_file()] if root.is_dir() else []
    nbytes, before, after = 0, 0, 0
    known = hasattr(os, "posix_fadvise")
    for path in files:
        try:
            nbytes += path.stat().st_size
            was = resident_bytes(path)
            _advise_dontneed(path)
            now = resident_bytes(path)
        except OSError as exc:
            logger.warning("cannot drop %s from the page cache: %s", path, exc)
            known = False
            continue
        if was is None or now is None:
            known = False
        else:
            before, after = before + was, after + now
    if not known:
        return DropResult(len(files), nbytes, None, None, False)
    return DropResult(len(files), nbytes, before, after, after <= RESIDENT_TOLERANCE * nbytes)


def _advise_dontneed(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # dirty pages cannot be dropped
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
