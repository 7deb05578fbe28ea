"""Recency on the disk backend's get path: a hit touches its page only once the page
has aged (it is not among the newest quarter of the store), and a batch of touches
(``IndexWriter.touch_many``) orders pages exactly as touching them one by one."""

from __future__ import annotations

import hashlib
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from storage_backends import StorageBackend, StorageConfig, create
from storage_backends.disk.index import DiskIndex
from storage_backends.disk.layout import SlotClass, SlotRun
from storage_backends.page_format import HEADER_BYTES

SIZE = 136  # a record of 192 bytes: its slot exactly (the store holds 8 of them)
RECORD = HEADER_BYTES + SIZE


def _key(i: int) -> bytes:
    return hashlib.sha256(f"recency-{i}".encode()).digest()


def _store(path: Path, pages: int) -> StorageBackend:
    config = StorageConfig(backend="disk", path=str(path), max_bytes=pages * RECORD, sync="none")
    return create("disk", config)


def _put(store: StorageBackend, ids: range) -> None:
    for i in ids:  # one page a call: stamps in this order
        assert store.put([_key(i)], [memoryview(bytes([i]) * SIZE)]) == [True]


def _read(store: StorageBackend, i: int) -> None:
    assert store.get([_key(i)], [memoryview(bytearray(SIZE))]) == [True]


def _present(store: StorageBackend, ids: range) -> list[int]:
    return [i for i in ids if store.exists([_key(i)]) == 1]


def test_an_aged_page_read_is_kept_and_a_young_one_keeps_its_place(tmp_path: Path) -> None:
    store = _store(tmp_path / "s", 8)
    try:
        _put(store, range(8))  # stamps 0-7; the newest quarter: pages 6 and 7
        _read(store, 6)  # young: not touched
        _read(store, 1)  # aged: touched, now the newest
        _put(store, range(8, 14))  # six evictions: 0, 2, 3, 4, 5, 6
        assert _present(store, range(14)) == [1, 7, 8, 9, 10, 11, 12, 13]
        assert store.stats().evictions == 6
    finally:
        store.close()


def test_a_read_after_this_process_stored_more_pages_ages_pages_by_the_new_count(
    tmp_path: Path,
) -> None:
    store = _store(tmp_path / "s", 16)
    try:
        _put(store, range(8))
        _read(store, 7)  # the newest of 8: young
        _put(store, range(8, 16))  # 16 pages now: page 7 is no longer among the newest 4
        _read(store, 7)  # aged: touched
        _put(store, range(16, 24))  # eight evictions: 0-6 and 8, not the page just read
        assert _present(store, range(24)) == [7, *range(9, 24)]
    finally:
        store.close()


def _filled_index(path: Path, n: int) -> DiskIndex:
    config = StorageConfig(backend="disk", path=str(path), max_bytes=1 << 20, sync="none")
    index = DiskIndex(path, config)
    cls = SlotClass(256, 64)
    with index.writing() as writer:
        keys = [_key(i) for i in range(n)]
        assert writer.insert_run(SlotRun(0, 0, n), cls, keys, [SIZE] * n) == [True] * n
    return index


def _eviction_order(index: DiskIndex) -> list[bytes]:
    with index.writing() as writer:
        while writer.evict_one():
            pass
        return list(writer.removed)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 9), max_size=30), st.lists(st.integers(0, 9), max_size=5))
def test_touch_many_orders_pages_as_touching_them_one_by_one(
    touched: list[int], later: list[int]
) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        one, many = _filled_index(Path(tmp) / "one", 10), _filled_index(Path(tmp) / "many", 10)
        try:
            with one.writing() as writer:
                for i in touched:
                    writer.touch(_key(i))
            with many.writing() as writer:
                writer.touch_many([_key(i) for i in touched])
            for index in (one, many):  # later touches and locations see the same state
                with index.writing() as writer:
                    for i in later:
                        writer.touch(_key(i))
            assert _eviction_order(many) == _eviction_order(one)
            assert one.size() == many.size() == (0, 0)
        finally:
            one.close()
            many.close()
