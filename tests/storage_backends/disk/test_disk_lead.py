"""Where records lie in a segment file: a new store puts every payload on a 64-byte
boundary of the file (its slots start ``RECORD_LEAD`` bytes in); a store written before
that keeps its records where they are; direct I/O on either keeps every other byte."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import lmdb
import pytest

import storage_backends.disk.index as disk_index
from storage_backends import StorageBackend, StorageConfig, StorageOpenError, create
from storage_backends.disk.index import DB_NAMES, META_RECORD_LEAD
from storage_backends.disk.layout import INDEX_DIR, RECORD_LEAD, slot_class
from storage_backends.disk.scan import locate
from storage_backends.page_format import HEADER_BYTES


def _key(i: int) -> bytes:
    return hashlib.sha256(f"lead-{i}".encode()).digest()


def _payload(i: int, size: int) -> bytes:
    return (hashlib.sha256(f"lead-bytes-{i}".encode()).digest() * (size // 32 + 1))[:size]


def _config(path: Path) -> StorageConfig:
    return StorageConfig(backend="disk", path=str(path), sync="none", max_bytes=64 << 20)


def _put(store: StorageBackend, ids: range, size: int) -> None:
    src = [memoryview(_payload(i, size)) for i in ids]
    assert store.put([_key(i) for i in ids], src) == [True] * len(ids)


def _all_read(store: StorageBackend, ids: range, size: int) -> bool:
    dst = [memoryview(bytearray(size)) for _ in ids]
    hits = store.get([_key(i) for i in ids], dst)
    return all(hits) and all(bytes(d) == _payload(i, size) for i, d in zip(ids, dst, strict=True))


def _payload_offsets(path: Path, ids: range) -> list[int]:
    places = [locate(path, _key(i)) for i in ids]
    return [place.offset + HEADER_BYTES for place in places if place is not None]


def test_a_new_store_puts_every_payload_on_a_64_byte_boundary(tmp_path: Path) -> None:
    path = tmp_path / "s"
    store = create("disk", _config(path))
    try:
        for n, size in enumerate((4096, 16 << 10, 20_000, 1 << 20)):
            _put(store, range(10 * n, 10 * n + 4), size)
            _put(store, range(10 * n + 4, 10 * n + 5), size)  # a batch of one, too
    finally:
        store.close()
    offsets = _payload_offsets(path, range(40))
    assert len(offsets) == 20 and all(offset % 64 == 0 for offset in offsets), offsets


def _drop_lead(path: Path) -> None:
    """Make the index look as a store's written before leads existed: no lead recorded."""
    env = lmdb.open(str(path / INDEX_DIR), max_dbs=len(DB_NAMES), subdir=True)
    try:
        with env.begin(write=True, db=env.open_db(b"meta")) as txn:
            assert txn.delete(META_RECORD_LEAD)
    finally:
        env.close()


def test_a_store_written_before_leads_keeps_its_records_where_they_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s"
    monkeypatch.setattr(disk_index, "RECORD_LEAD", 0)  # the earlier version's layout
    store = create("disk", _config(path))
    _put(store, range(6), 16 << 10)
    store.close()
    monkeypatch.undo()
    _drop_lead(path)
    store = create("disk", _config(path))
    try:
        assert _all_read(store, range(6), 16 << 10)
        _put(store, range(6, 12), 16 << 10)  # new pages go where the old layout says
        assert _all_read(store, range(12), 16 << 10)
        assert store.stats().corrupt == 0
    finally:
        store.close()
    assert [offset % 64 for offset in _payload_offsets(path, range(12))] == [HEADER_BYTES] * 12


def test_a_damaged_lead_is_a_quarantined_store(tmp_path: Path) -> None:
    path = tmp_path / "s"
    store = create("disk", _config(path))
    _put(store, range(2), 4096)
    store.close()
    env = lmdb.open(str(path / INDEX_DIR), max_dbs=len(DB_NAMES), subdir=True)
    with env.begin(write=True, db=env.open_db(b"meta")) as txn:
        txn.put(META_RECORD_LEAD, (5).to_bytes(8, "big"))
    env.close()
    store = create("disk", _config(path))
    try:
        assert store.stats().quarantined == 1 and store.stats().entries == 0
        assert [p.name.startswith("s.damaged-") for p in tmp_path.iterdir()].count(True) == 1
    finally:
        store.close()


def test_direct_writes_keep_the_bytes_before_a_record_in_its_block(tmp_path: Path) -> None:
    """Pages whose records fill their slots exactly (4,096 bytes), written without
    O_DIRECT, then more of them with it: each new record's first block starts with the
    last ``RECORD_LEAD`` bytes of the record before it, which the direct write keeps."""
    size = 4096 - HEADER_BYTES
    assert slot_class(size, direct_io=False).stride == HEADER_BYTES + size == 4096
    path = tmp_path / "s"
    store = create("disk", _config(path))
    _put(store, range(4), size)
    store.close()
    try:
        store = create("disk", replace(_config(path), direct_io=True))
    except StorageOpenError:
        pytest.skip("this file system refuses O_DIRECT")
    try:
        for i in range(4, 8):  # one a batch: each write's first block holds its neighbour's end
            _put(store, range(i, i + 1), size)
        assert _all_read(store, range(8), size)
    finally:
        store.close()
    store = create("disk", _config(path))
    try:
        assert _all_read(store, range(8), size) and store.stats().corrupt == 0
    finally:
        store.close()
    assert RECORD_LEAD and all(offset % 64 == 0 for offset in _payload_offsets(path, range(8)))
