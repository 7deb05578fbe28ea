"""The disk store's clean-close marker against an index changed in place after the clean
close: same size, same inode (a tool writing into the file, ``dd conv=notrunc``, a
restore with ``rsync --inplace --times``). The open runs the index check anyway: a
damaged index is quarantined, never opened unchecked. (The ``lmdb`` backend's twin:
``tests/storage_backends/lmdb/test_clean.py``.)"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

import storage_backends.disk.backend as disk_backend
from storage_backends import StorageBackend, StorageConfig, create
from storage_backends.disk.layout import INDEX_DIR
from storage_backends.lmdb.check import CheckResult, check_store

SIZE = 4096
N = 6


def _key(i: int) -> bytes:
    return hashlib.sha256(f"clean-{i}".encode()).digest()


def _payload(i: int) -> bytes:
    return hashlib.sha256(f"clean-bytes-{i}".encode()).digest() * (SIZE // 32)


def _config(path: Path) -> StorageConfig:
    return StorageConfig(backend="disk", path=str(path), max_bytes=1 << 20, sync="none")


def _served(store: StorageBackend) -> list[bool]:
    dst = [memoryview(bytearray(SIZE)) for _ in range(N)]
    hits = store.get([_key(i) for i in range(N)], dst)
    for i, (hit, buf) in enumerate(zip(hits, dst, strict=True)):
        assert not hit or bytes(buf) == _payload(i), f"page {i}: wrong bytes served"
    return hits


def _closed_cleanly(path: Path) -> Path:
    """A store of ``N`` pages, closed cleanly (by the last of two opens); its index file."""
    store = create("disk", _config(path))
    assert store.put([_key(i) for i in range(N)], [memoryview(_payload(i)) for i in range(N)])
    store.close()
    create("disk", _config(path)).close()
    return path / INDEX_DIR / "data.mdb"


def _past_timestamp_tick(data: Path) -> None:
    """Wait (bounded) until the file system's clock has moved past the file's last change,
    so that a write now gives it other times (file times come from a coarse clock): a
    probe file beside the store is touched until its change time is later."""
    changed = max(data.stat().st_mtime_ns, data.stat().st_ctime_ns)
    probe = data.parents[2] / "clock-probe"
    probe.touch()
    deadline = time.monotonic() + 5.0
    while True:
        os.utime(probe)
        if probe.stat().st_ctime_ns > changed:
            break
        assert time.monotonic() < deadline, "the file system's clock did not move in 5 s"
        time.sleep(0.001)
    probe.unlink()


def _write_in_place(data: Path, at: int, new: bytes, keep_times: bool) -> None:
    """Overwrite bytes of ``data`` in place (same inode, same size); with ``keep_times``
    its access and modification times are put back afterwards."""
    before = data.stat()
    _past_timestamp_tick(data)
    with open(data, "r+b") as f:
        f.seek(at)
        f.write(new)
    if keep_times:
        os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = data.stat()
    assert (after.st_ino, after.st_size) == (before.st_ino, before.st_size)
    assert not keep_times or after.st_mtime_ns == before.st_mtime_ns


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The index checks that opens run (each is also run for real)."""
    ran: list[Path] = []

    def spy(path: Path, timeout_s: float) -> CheckResult:
        ran.append(path)
        return check_store(path, timeout_s)

    monkeypatch.setattr(disk_backend, "check_store", spy)
    return ran


def test_an_index_damaged_in_place_after_a_clean_close_is_checked_and_quarantined(
    tmp_path: Path, checks: list[Path]
) -> None:
    path = tmp_path / "store"
    data = _closed_cleanly(path)
    before = len(checks)
    _write_in_place(data, 4096 * 2, os.urandom(4096 * 2), keep_times=False)  # B-tree pages
    store = create("disk", _config(path))
    try:
        assert len(checks) == before + 1
        assert store.stats().quarantined == 1
        assert _served(store) == [False] * N
        assert all(
            store.put([_key(i) for i in range(N)], [memoryview(_payload(i)) for i in range(N)])
        )
        assert _served(store) == [True] * N
    finally:
        store.close()
    assert any(p.name.startswith("store.damaged-") for p in tmp_path.iterdir())


def test_an_index_written_in_place_with_its_times_put_back_is_checked(
    tmp_path: Path, checks: list[Path]
) -> None:
    """Same size, same inode, same modification time: only the change time tells (the
    bytes written are the ones that were there, so the check finds the index sound)."""
    path = tmp_path / "store"
    data = _closed_cleanly(path)
    before = len(checks)
    at = 4096 * 2
    with open(data, "rb") as f:
        f.seek(at)
        same = f.read(4096)
    _write_in_place(data, at, same, keep_times=True)
    store = create("disk", _config(path))
    try:
        assert len(checks) == before + 1, "the open skipped the index check"
        assert store.stats().quarantined == 0
        assert _served(store) == [True] * N
    finally:
        store.close()
    again = create("disk", _config(path))  # closed cleanly and unchanged: no check
    again.close()
    assert len(checks) == before + 1
