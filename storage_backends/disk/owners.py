"""Who has a store open, and whether its index was closed cleanly.

Every process holding the store open keeps a shared ``flock`` on ``owners.lock``.
The opener that can take it exclusively is alone: it decides whether the index
needs its structural check (a child-process walk, ``storage_backends.lmdb.check``) and removes the
clean-close marker; the closer that can take it exclusively is the last one, and
writes the marker after the index is synced. The marker records the index file's
size, modification and change times and inode, so an index changed behind the
marker's back (restored, edited, damaged by a tool, its times put back) is checked
anyway. The marker is a file, not an index entry, because it must be read before the
index is mapped.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from pathlib import Path

from storage_backends.disk.layout import CLEAN_MARKER, OWNERS_LOCK
from storage_backends.errors import StorageOpenError

logger = logging.getLogger(__name__)

_POLL_S = 0.01


def _identity(data_file: Path) -> str | None:
    try:
        st = os.stat(data_file)
    except OSError:
        return None
    # The change time too: a write in place whose modification time was put back keeps
    # size, inode and mtime; its change time moves (a write within the close's own
    # timestamp tick would still keep both).
    return f"{st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_ino}"


class Ownership:
    """This process's hold on one store directory."""

    def __init__(self, root: Path, timeout_s: float) -> None:
        self._root = root
        try:
            self._fd = os.open(root / OWNERS_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StorageOpenError(
                f"storage.path {root}: cannot open {OWNERS_LOCK}: {exc}"
            ) from exc
        self.alone = self._try(fcntl.LOCK_EX)
        if not self.alone:
            self._wait_shared(timeout_s)

    def _try(self, mode: int) -> bool:
        try:
            fcntl.flock(self._fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _wait_shared(self, timeout_s: float) -> None:
        """Shared hold, waiting (bounded) for an opener that is checking the index."""
        deadline = time.monotonic() + timeout_s
        while not self._try(fcntl.LOCK_SH):
            if time.monotonic() > deadline:
                os.close(self._fd)
                raise StorageOpenError(
                    f"storage.path {self._root}: another process held it exclusively for "
                    f"{timeout_s:g} s (checking its index)"
                )
            time.sleep(_POLL_S)

    def closed_cleanly(self, data_file: Path) -> bool:
        """Whether the last close left the index as it is now (only meaningful when alone)."""
        try:
            recorded = (self._root / CLEAN_MARKER).read_text().strip()
        except OSError:
            return False
        return recorded == _identity(data_file)

    def opened(self) -> None:
        """The index is about to change: remove the marker and share the store."""
        (self._root / CLEAN_MARKER).unlink(missing_ok=True)
        if self.alone:
            fcntl.flock(self._fd, fcntl.LOCK_SH)

    def release(self, data_file: Path | None) -> None:
        """Let go; the last owner writes the marker for ``data_file`` (None: not clean)."""
        try:
            if data_file is not None and self._try(fcntl.LOCK_EX):
                self._write_marker(data_file)
        finally:
            os.close(self._fd)

    def _write_marker(self, data_file: Path) -> None:
        identity = _identity(data_file)
        if identity is None:
            return
        marker = self._root / CLEAN_MARKER
        tmp = marker.with_suffix(".tmp")
        try:
            # Not fsynced: the index was synced before, so a marker lost or left empty by
            # an OS crash only costs a check at the next open.
            tmp.write_text(identity + "\n")
            os.replace(tmp, marker)
        except OSError:
            logger.warning(
                "could not write the clean-close marker of %s", self._root, exc_info=True
            )
