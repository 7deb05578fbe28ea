"""The clean-close marker: only the last process to close a store marks it clean, and
any change to ``data.mdb`` since makes the next open check it."""

from __future__ import annotations

import os
from pathlib import Path

from storage_backends.lmdb.clean import OpenLock, OpenState


def test_only_the_last_holder_marks_the_store_clean(tmp_path: Path) -> None:
    new = OpenLock(tmp_path)
    assert new.state is OpenState.NEW  # no data.mdb yet
    new.release(mark_clean=True)
    (tmp_path / "data.mdb").write_bytes(b"\0" * 8192)
    first = OpenLock(tmp_path)
    assert first.state is OpenState.UNKNOWN  # never closed cleanly
    second = OpenLock(tmp_path)
    assert second.state is OpenState.IN_USE  # the first holder checked it
    second.release(mark_clean=True)  # the first still holds it: no marker
    first.release(mark_clean=False)  # and then dies (or fails its flush)
    after_crash = OpenLock(tmp_path)
    assert after_crash.state is OpenState.UNKNOWN
    after_crash.release(mark_clean=True)  # the last one out, flushed
    again = OpenLock(tmp_path)
    assert again.state is OpenState.CLEAN
    again.release(mark_clean=False)
    unclean = OpenLock(tmp_path)
    assert unclean.state is OpenState.UNKNOWN  # the marker went at the open before
    unclean.release(mark_clean=False)


def test_a_file_changed_after_the_clean_close_is_unknown(tmp_path: Path) -> None:
    data = tmp_path / "data.mdb"
    data.write_bytes(b"\0" * 8192)
    OpenLock(tmp_path).release(mark_clean=True)
    stat = data.stat()
    with open(data, "r+b") as f:  # same size, same meta pages, times put back
        f.seek(4096 * 2 - 1)
        f.write(b"\0")
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    hold = OpenLock(tmp_path)
    assert hold.state is OpenState.UNKNOWN  # the change time still tells
    hold.release(mark_clean=False)
