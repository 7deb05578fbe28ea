"""Whether an LMDB store needs its structural check at open: the clean-close marker.

The check (``check``) walks the whole file in a child process, which for a
store of millions of pages takes longer than a restart should. It is needed
only when the file may have been damaged while no one was looking: a process or
OS crash, or a write by something else. So the last process to close a store
flushes it and writes ``CLEAN_MARKER`` (the identity of ``data.mdb`` then:
inode, size, modification and change times, and a hash of its two meta pages);
every open removes the marker before mapping the store, and skips the check
only when the marker matched the file. A store that another process holds
open was checked by that process and is in use: it is not checked again (a
walk of a file being written would see half-written pages as damage).

Who is open is an ``flock`` on ``OPEN_LOCK`` in the store directory: shared
while open, exclusive (never waited for) by the closer that writes the marker.
Not thread-safe: one ``OpenLock`` per backend, used under its own lock.
"""

from __future__ import annotations

import enum
import fcntl
import hashlib
import logging
import os
import time
from pathlib import Path
from typing import NamedTuple

logger = logging.getLogger(__name__)

CLEAN_MARKER = "hicache-clean-close"
OPEN_LOCK = "hicache-open.lock"
_META_BYTES = 2 * 4096  # LMDB's two meta pages (4 KiB pages on every platform we run)
_LOCK_WAIT_S = 5.0  # a closer holds the exclusive lock only while it writes a small file


class OpenState(enum.Enum):
    """What is known about a store's file at open."""

    NEW = "new"  # no data.mdb yet
    CLEAN = "clean"  # closed cleanly and unchanged since
    IN_USE = "in use"  # another process holds it open (it checked it)
    UNKNOWN = "unknown"  # not closed cleanly, or changed since: check it


class _Identity(NamedTuple):
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int
    meta_sha256: str

    def encode(self) -> str:
        return " ".join(str(part) for part in self)


def _identity(data: Path) -> _Identity | None:
    try:
        with open(data, "rb") as f:
            st = os.fstat(f.fileno())
            meta = hashlib.sha256(f.read(_META_BYTES)).hexdigest()
    except OSError:
        return None
    return _Identity(st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, meta)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class OpenLock:
    """A process's hold on a store directory, from before the map until after the close."""

    def __init__(self, path: Path) -> None:
        """Take the hold on ``path`` (a directory) and find its ``state``; removes the marker.

        Raises OSError when the lock file cannot be created (the caller then
        treats the store as UNKNOWN).
        """
        self.path = path
        self._fd = os.open(path / OPEN_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self.state = self._take()
        except BaseException:
            os.close(self._fd)
            raise

    def _take(self) -> OpenState:
        if _try_lock(self._fd, fcntl.LOCK_EX):
            state = self._read_marker()
            fcntl.flock(self._fd, fcntl.LOCK_SH)  # others may open it now
            return state
        if not _wait_lock(self._fd, fcntl.LOCK_SH):
            logger.warning("store %s: could not take its open lock; checking it", self.path)
            return OpenState.UNKNOWN
        self._clear_marker()  # a closer may have finished while we waited: it is ours now
        return OpenState.IN_USE if (self.path / "data.mdb").exists() else OpenState.NEW

    def _read_marker(self) -> OpenState:
        data = self.path / "data.mdb"
        if not data.exists():
            self._clear_marker()
            return OpenState.NEW
        try:
            recorded = (self.path / CLEAN_MARKER).read_text()
        except OSError:
            recorded = None
        current = _identity(data)
        self._clear_marker()
        if recorded is not None and current is not None and recorded == current.encode():
            return OpenState.CLEAN
        return OpenState.UNKNOWN

    def _clear_marker(self) -> None:
        """Remove the marker durably, before anything may write the file."""
        try:
            os.unlink(self.path / CLEAN_MARKER)
        except FileNotFoundError:
            return
        _fsync_dir(self.path)

    def release(self, mark_clean: bool) -> None:
        """Let go; with ``mark_clean`` (the caller flushed and closed the store) and no
        other process holding it, write the marker. Errors are logged, never raised."""
        try:
            if mark_clean and _try_lock(self._fd, fcntl.LOCK_EX):
                self._write_marker()
        except OSError as exc:
            logger.warning("store %s: could not mark it closed cleanly: %s", self.path, exc)
        finally:
            os.close(self._fd)

    def _write_marker(self) -> None:
        current = _identity(self.path / "data.mdb")
        if current is None:
            return
        tmp = self.path / f"{CLEAN_MARKER}.tmp"
        with open(tmp, "w") as f:
            f.write(current.encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path / CLEAN_MARKER)
        _fsync_dir(self.path)


def _try_lock(fd: int, kind: int) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _wait_lock(fd: int, kind: int) -> bool:
    """Take the lock within ``_LOCK_WAIT_S`` (polling: flock has no timeout)."""
    deadline = time.monotonic() + _LOCK_WAIT_S
    while not _try_lock(fd, kind):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
