"""A damaged disk store: a damaged record, a zeroed slot, a truncated or deleted
segment, a damaged index. Each is a counted miss (the page dropped) or a quarantine
of the store, never a crash and never a wrong byte; the next write works."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import storage_backends.disk.backend as disk_backend
from storage_backends import StorageBackend, StorageConfig, create
from storage_backends.disk.layout import INDEX_DIR
from storage_backends.disk.scan import RecordPlace, locate
from storage_backends.lmdb.check import CheckResult, check_store
from storage_backends.page_format import HEADER_BYTES

SIZE = 8192
N = 6
Injure = Callable[[RecordPlace], None]


def _key(i: int) -> bytes:
    return hashlib.sha256(f"page-{i}".encode()).digest()


def _payload(i: int) -> bytes:
    return hashlib.sha256(f"payload-{i}".encode()).digest() * (SIZE // 32)


def _config(path: Path) -> StorageConfig:
    return StorageConfig(backend="disk", path=str(path), max_bytes=1 << 20, sync="none")


def _filled(path: Path) -> None:
    store = create("disk", _config(path))
    ids = range(N)
    assert all(store.put([_key(i) for i in ids], [memoryview(_payload(i)) for i in ids]))
    store.close()


def _rewrite(place: RecordPlace, change: Callable[[bytearray], bytes]) -> None:
    with open(place.segment, "r+b") as f:
        f.seek(place.offset)
        record = bytearray(f.read(place.length))
        f.seek(place.offset)
        f.write(change(record))


def _flip(at: int) -> Injure:
    def injure(place: RecordPlace) -> None:
        def change(record: bytearray) -> bytes:
            record[at] ^= 0x40
            return bytes(record)

        _rewrite(place, change)

    return injure


def _torn(record: bytearray, cut: int) -> bytes:
    """The first ``cut`` bytes written, the rest never (zeros, as in a fresh file)."""
    return bytes(record[:cut]) + bytes(len(record) - cut)


RECORD_DAMAGE: dict[str, Injure] = {
    "payload_bit_flip": _flip(HEADER_BYTES + SIZE // 2),
    "header_key_bit_flip": _flip(20),
    "header_version": _flip(4),
    "zeroed_slot": lambda place: _rewrite(place, lambda r: bytes(len(r))),
    "torn_write": lambda place: _rewrite(place, lambda r: _torn(r, HEADER_BYTES + SIZE // 3)),
}


def _read_all(store: StorageBackend) -> list[bool]:
    dst = [memoryview(bytearray(SIZE)) for _ in range(N)]
    hits = store.get([_key(i) for i in range(N)], dst)
    for i, (hit, buf) in enumerate(zip(hits, dst, strict=True)):
        assert not hit or bytes(buf) == _payload(i), f"page {i}: wrong bytes served"
    return hits


def _writes_again(store: StorageBackend) -> None:
    ids = range(N)
    assert all(store.put([_key(i) for i in ids], [memoryview(_payload(i)) for i in ids]))
    assert _read_all(store) == [True] * N


@pytest.mark.parametrize("damage", sorted(RECORD_DAMAGE))
def test_damaged_record_is_a_counted_miss_and_dropped(tmp_path: Path, damage: str) -> None:
    path = tmp_path / "store"
    _filled(path)
    place = locate(path, _key(2))
    assert place is not None
    RECORD_DAMAGE[damage](place)
    store = create("disk", _config(path))
    try:
        assert _read_all(store) == [i != 2 for i in range(N)]
        stats = store.stats()
        assert (stats.corrupt, stats.entries) == (1, N - 1)
        assert store.exists([_key(2)]) == 0
        assert _key(2) in store.take_removed()
        _writes_again(store)
    finally:
        store.close()


def _truncate_segment(path: Path) -> None:
    place = locate(path, _key(N // 2))
    assert place is not None
    os.truncate(place.segment, place.offset + place.length // 2)


def _delete_segment(path: Path) -> None:
    place = locate(path, _key(0))
    assert place is not None
    place.segment.unlink()


@pytest.mark.parametrize("injure", [_truncate_segment, _delete_segment])
def test_lost_segment_bytes_are_misses(tmp_path: Path, injure: Callable[[Path], None]) -> None:
    path = tmp_path / "store"
    _filled(path)
    injure(path)
    store = create("disk", _config(path))
    try:
        hits = _read_all(store)
        assert not all(hits)
        assert store.stats().corrupt == hits.count(False)
        _writes_again(store)
    finally:
        store.close()


def test_damaged_index_is_quarantined_at_open(tmp_path: Path) -> None:
    path = tmp_path / "store"
    _filled(path)
    data = path / INDEX_DIR / "data.mdb"
    raw = bytearray(data.read_bytes())
    raw[4096 : 4096 * 3] = os.urandom(4096 * 2)  # B-tree pages after the two meta pages
    data.write_bytes(bytes(raw))
    store = create("disk", _config(path))
    try:
        assert store.stats().quarantined == 1
        assert _read_all(store) == [False] * N
        _writes_again(store)
    finally:
        store.close()
    assert any(p.name.startswith("store.damaged-") for p in tmp_path.iterdir())


def test_clean_close_skips_nothing_that_changed(tmp_path: Path) -> None:
    """A store closed cleanly, then damaged behind its back, is still checked."""
    path = tmp_path / "store"
    _filled(path)
    reopened = create("disk", _config(path))
    reopened.close()  # clean again
    data = path / INDEX_DIR / "data.mdb"
    data.write_bytes(data.read_bytes()[: 4096 * 3])  # truncated
    store = create("disk", _config(path))
    try:
        assert store.stats().quarantined == 1
        _writes_again(store)
    finally:
        store.close()


# Opens the store and dies without closing it: a crash, as far as the store can tell.
CRASH = """
import os, sys
from storage_backends import create
from tests.storage_backends.disk.test_disk_damage import _config
create("disk", _config(sys.argv[1]))
os._exit(0)
"""


def test_the_index_check_runs_after_a_crash_and_not_after_a_clean_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Open is bounded: the index's structural check is skipped after a clean close."""
    checked: list[Path] = []

    def spy(path: Path, timeout_s: float) -> CheckResult:
        checked.append(path)
        return check_store(path, timeout_s)

    monkeypatch.setattr(disk_backend, "check_store", spy)
    path = tmp_path / "store"
    _filled(path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    subprocess.run([sys.executable, "-c", CRASH, str(path)], check=True, env=env, timeout=60)
    before = len(checked)
    for expected in (before + 1, before + 1):  # checked after the crash, then closed cleanly
        store = create("disk", _config(path))
        try:
            assert len(checked) == expected and _read_all(store) == [True] * N
        finally:
            store.close()
