"""The disk store's free space: extents of no size class. Freed slots merge with free
neighbours and serve any class; a release that would overlap free space changes
nothing; a store of the first format (free slots listed per class) opens with its
free slots turned into extents; churn does not grow the index."""

from __future__ import annotations

import hashlib
from pathlib import Path

import lmdb

from storage_backends import StorageConfig, create
from storage_backends.disk.index import DB_NAMES, DiskIndex
from storage_backends.disk.layout import INDEX_DIR, Slot, SlotClass, SlotRun, slot_class

SMALL = slot_class(5000, direct_io=False)
BIG = SlotClass(2 * SMALL.stride, SMALL.align)


def _config(path: Path) -> StorageConfig:
    return StorageConfig(backend="disk", path=str(path), max_bytes=8 * SMALL.stride, sync="none")


def _index(path: Path) -> DiskIndex:
    path.mkdir(parents=True, exist_ok=True)
    return DiskIndex(path / INDEX_DIR, _config(path))


def _slots(n: int) -> list[Slot]:
    return SlotRun(0, 0, n).slots(SMALL.stride)


def test_freed_neighbours_serve_a_larger_class(tmp_path: Path) -> None:
    index = _index(tmp_path)
    try:
        with index.writing() as writer:
            assert writer.alloc.take(SMALL, 8) == [SlotRun(0, 0, 8)]  # max_bytes reached
            for n in (2, 5, 3):
                assert writer.alloc.release(_slots(8)[n], SMALL)
            assert writer.alloc.take(BIG, 1) == [SlotRun(0, 2 * SMALL.stride, 1)]
            assert writer.alloc.take(SMALL, 1) == [SlotRun(0, 5 * SMALL.stride, 1)]
    finally:
        index.close()


def test_a_release_that_overlaps_free_space_changes_nothing(tmp_path: Path) -> None:
    index = _index(tmp_path)
    try:
        with index.writing() as writer:
            writer.alloc.take(SMALL, 4)
            assert writer.alloc.release(_slots(4)[1], SMALL)
            assert not writer.alloc.release(_slots(4)[1], SMALL)  # twice
            assert not writer.alloc.release(Slot(0, SMALL.stride + 64), SMALL)  # inside it
            assert not writer.alloc.release(_slots(8)[6], SMALL)  # past the tail
            # The slot comes back once, then new ones from the tail.
            assert writer.alloc.take(SMALL, 2) == [
                SlotRun(0, SMALL.stride, 1),
                SlotRun(0, 4 * SMALL.stride, 1),
            ]
    finally:
        index.close()


def test_free_slots_of_the_first_format_become_extents(tmp_path: Path) -> None:
    index = _index(tmp_path)
    try:
        with index.writing() as writer:
            writer.alloc.take(SMALL, 8)
    finally:
        index.close()
    env = lmdb.open(str(tmp_path / INDEX_DIR), max_dbs=len(DB_NAMES))
    try:  # what the first format kept for free slots 2, 3 and 5
        free, by_class, meta = (env.open_db(name) for name in (b"free", b"free_class", b"meta"))
        with env.begin(write=True) as txn:
            txn.delete(b"free_format", db=meta)
            for n in (2, 3, 5):
                txn.put(_slots(8)[n].pack(), SMALL.pack(), db=free)
                txn.put(SMALL.pack() + _slots(8)[n].pack(), b"", db=by_class)
    finally:
        env.close()
    index = _index(tmp_path)
    try:
        with index.writing() as writer:
            assert writer.alloc.take(BIG, 1) == [SlotRun(0, 2 * SMALL.stride, 1)]
            assert writer.alloc.take(SMALL, 1) == [SlotRun(0, 5 * SMALL.stride, 1)]
    finally:
        index.close()


def test_churn_keeps_the_index_small(tmp_path: Path) -> None:
    """A full store of 4 KiB pages put over four times: every put evicts and each freed
    slot merges with the extent before it. Measured: ~620 index bytes a page; ~2,700
    when each merge emptied the by-size table for a moment (LMDB freed its root page
    and took another, once a release)."""
    pages, size = 1000, 4096
    path = tmp_path / "s"
    config = StorageConfig(
        backend="disk", path=str(path), max_bytes=pages * (size + 64), sync="none"
    )
    store = create("disk", config)
    try:
        payload = memoryview(bytes(size))
        for start in range(0, 4 * pages, 128):
            keys = [hashlib.sha256(b"%d" % n).digest() for n in range(start, start + 128)]
            assert all(store.put(keys, [payload] * 128))
        entries = store.stats().entries
    finally:
        store.close()
    assert (path / INDEX_DIR / "data.mdb").stat().st_size / entries < 1000


def test_room_goes_by_age_when_the_oldest_slot_is_large_enough(tmp_path: Path) -> None:
    """A free fragment too small for a 3,000-byte page lies before a page just used;
    the least recently used page's slot holds one: that page goes, not the one after
    the fragment (growing free space is for sizes the oldest slot cannot hold)."""
    mid, small = slot_class(5000, direct_io=False), slot_class(3000, direct_io=False)
    path = tmp_path
    config = StorageConfig(
        backend="disk", path=str(path), max_bytes=8 * mid.stride - small.stride, sync="none"
    )
    index = DiskIndex(path / INDEX_DIR, config)
    keys = [hashlib.sha256(b"room-%d" % n).digest() for n in range(9)]
    at: dict[Slot, bytes] = {}
    try:
        with index.writing() as writer:
            run = writer.reserve(mid, 8, 8 * 156)[0]
            assert run == SlotRun(0, 0, 8)  # allocated past max_bytes by less than a slot
            writer.insert_run(run, mid, keys[:8], [100] * 8)  # small records, full slots
            at.update(zip(run.slots(mid.stride), keys[:8], strict=True))
            assert writer.remove(keys[5])
            cut = writer.reserve(small, 1, 156)[0]  # leaves a fragment before page 6
            assert cut == SlotRun(0, 5 * mid.stride, 1)
            writer.insert_run(cut, small, keys[8:], [100])
            writer.touch(keys[6])
            writer.removed.clear()
            assert writer.reserve(small, 1, 156, at.get) == [SlotRun(0, 0, 1)]
            assert writer.removed == [keys[0]]
    finally:
        index.close()
