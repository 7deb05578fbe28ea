"""Segment files: page records at known offsets, written with pwritev and read with preadv.

One file descriptor per segment, opened on first use and kept; pread/pwrite take
explicit offsets, so every thread (and process) shares them without seeking. Slots
lie ``lead`` bytes from the start of the file (``layout.RECORD_LEAD``): callers give
slot offsets, the lead is added here. With O_DIRECT, records go through page-aligned
bounce buffers (the kernel wants the buffer, the offset and the length aligned); a
write that starts inside a block writes that block's earlier bytes back as they were
read; otherwise straight from and into the caller's buffers.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from collections.abc import Sequence
from pathlib import Path

from storage_backends.disk.layout import BLOCK, round_up, segment_name
from storage_backends.errors import StorageOpenError

_DIRECT = getattr(os, "O_DIRECT", 0)
# Files grow ahead of the writes (posix_fallocate), so that writes land in allocated
# blocks and a full disk shows up as one failed put, not a torn record: by 1/64 of
# their size, at least 1 MiB and at most 64 MiB at a time. So a file holds at most
# 1 MiB or 1.6% more than its records (doubling held up to 2x: 4,100 pages of 4 KiB
# took a 32 MiB file), for about one call per 4 MiB written.
_GROW_STEP = 64 << 20
_MIN_GROW = 1 << 20
_GROW_SHARE = 64


class SegmentFiles:
    """The segment files of one store directory. Thread-safe.

    ``write`` and ``read`` raise OSError (ENOENT for a deleted segment when
    reading, ENOSPC for a full disk); callers turn it into a failed put or a miss.
    """

    def __init__(self, root: Path, max_file_bytes: int, direct_io: bool, lead: int = 0) -> None:
        self._root = root
        self._max_file_bytes = round_up(max_file_bytes + lead, BLOCK)
        self._direct = direct_io
        self.lead = lead
        self._fds: dict[int, int] = {}
        self._sizes: dict[int, int] = {}
        self._lock = threading.Lock()

    def path(self, segment: int) -> Path:
        return self._root / segment_name(segment)

    def _fd(self, segment: int, create: bool) -> int:
        fd = self._fds.get(segment)  # the common case, without the lock
        if fd is not None:
            return fd
        with self._lock:
            fd = self._fds.get(segment)
            if fd is None:
                flags = os.O_RDWR | (os.O_CREAT if create else 0) | (_DIRECT if self._direct else 0)
                fd = os.open(self.path(segment), flags, 0o644)
                self._fds[segment] = fd
            return fd

    def reserve(self, segment: int, end: int) -> None:
        """Make sure blocks exist up to slot offset ``end`` (grows in steps). OSError
        (ENOSPC) if not."""
        end += self.lead
        with self._lock:
            known = self._sizes.get(segment, 0)
        if end <= known:
            return
        fd = self._fd(segment, create=True)
        size = os.fstat(fd).st_size
        if end > size:
            step = min(max(size // _GROW_SHARE, _MIN_GROW), _GROW_STEP)
            target = max(end, min(size + step, self._max_file_bytes))
            try:
                os.posix_fallocate(fd, size, target - size)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise  # ENOSPC: the put fails; without fallocate support, writes grow it
            size = max(size, os.fstat(fd).st_size)
        with self._lock:
            self._sizes[segment] = max(size, self._sizes.get(segment, 0))

    def write(self, segment: int, offset: int, bufs: Sequence[bytes | memoryview]) -> None:
        """Write ``bufs`` back to back from the record at slot offset ``offset``; OSError
        unless all of them were written."""
        fd = self._fd(segment, create=True)
        if self._direct:
            _write_direct(fd, offset + self.lead, bufs)
            return
        written = os.pwritev(fd, bufs, offset + self.lead)
        if written != sum(map(len, bufs)):
            raise OSError(errno.EIO, f"short write: {written} bytes")

    def read(self, segment: int, offset: int, bufs: Sequence[bytearray | memoryview]) -> int:
        """Fill ``bufs`` in order from the record at slot offset ``offset``; return the
        bytes read (short at the end of the file)."""
        fd = self._fd(segment, create=False)
        if self._direct:
            return _read_direct(fd, offset + self.lead, bufs)
        return os.preadv(fd, bufs, offset + self.lead)

    def sync(self) -> None:
        """fdatasync every segment written through this object."""
        with self._lock:
            fds = list(self._fds.values())
        for fd in fds:
            os.fdatasync(fd)

    def close(self) -> None:
        with self._lock:
            fds, self._fds = list(self._fds.values()), {}
        for fd in fds:
            os.close(fd)


def check_direct_io(root: Path) -> None:
    """StorageOpenError unless files under ``root`` can be opened with O_DIRECT."""
    if not _DIRECT:
        raise StorageOpenError("storage.direct_io: O_DIRECT is not available on this platform")
    probe = root / ".direct-io-probe"
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT | _DIRECT, 0o644)
    except OSError as exc:
        raise StorageOpenError(
            f"storage.direct_io: the file system of {root} refuses O_DIRECT ({exc.strerror}); "
            "set storage.direct_io = false"
        ) from exc
    os.close(fd)
    probe.unlink(missing_ok=True)


def _aligned(size: int) -> mmap.mmap:
    """An anonymous page-aligned buffer of ``size`` bytes (a multiple of BLOCK)."""
    return mmap.mmap(-1, size)


def _write_direct(fd: int, offset: int, bufs: Sequence[bytes | memoryview]) -> None:
    skip = offset % BLOCK  # slots ``lead`` bytes into the file: keep the block's first bytes
    total = sum(len(buf) for buf in bufs)
    length = round_up(skip + total, BLOCK)
    with _aligned(length) as bounce:
        if skip:
            with _aligned(BLOCK) as head:
                os.preadv(fd, [head], offset - skip)
                bounce[:skip] = head[:skip]
        at = skip
        for buf in bufs:
            bounce[at : at + len(buf)] = buf
            at += len(buf)
        written = os.pwritev(fd, [bounce], offset - skip)
    if written != length:
        raise OSError(errno.EIO, f"short write: {written} bytes")


def _read_direct(fd: int, offset: int, bufs: Sequence[bytearray | memoryview]) -> int:
    # Records written without O_DIRECT sit at 64-byte offsets: read from the block below.
    skip = offset % BLOCK
    total = sum(len(buf) for buf in bufs)
    with _aligned(round_up(skip + total, BLOCK)) as bounce:
        got = max(0, min(os.preadv(fd, [bounce], offset - skip) - skip, total))
        view = memoryview(bounce)
        try:
            at = skip
            for buf in bufs:
                buf[:] = view[at : at + len(buf)]
                at += len(buf)
        finally:
            view.release()
    return got
