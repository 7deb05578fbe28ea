"""Room-making for a new page size next to a stale record header: the slot right after
the largest free extent holds the record of a put killed before its commit, whose key
the index puts elsewhere (stored again since). Room-making passes that slot over (no
one is known to hold it) and grows another extent: the page that key names, stored
elsewhere and the most recently used, stays. The property tests
(``test_disk_stateful``, ``test_disk_classes``) reach such a header only in some draws;
this test builds it every run.

The killed put is a put whose fault hook (``DiskBackend.fault_hook``, called at each
``PutPhase``) raises after its records were written: its index transaction never
commits, as when the process dies there."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from storage_backends import StorageConfig, create
from storage_backends.disk import DiskBackend, PutPhase
from storage_backends.disk.layout import slot_class
from storage_backends.page_format import HEADER_BYTES

OLD, NEW = 3000, 16384
PAGES = 24  # old pages that fill the store by bytes
STALE = 16  # the slot the killed put writes into
FREED = [STALE - 1 - 2 * n for n in range(6)]  # one-slot extents; the highest ends at STALE


def _key(tag: str, i: int = 0) -> bytes:
    return hashlib.sha256(f"stale-{tag}-{i}".encode()).digest()


def _payload(tag: str, i: int, size: int) -> bytes:
    seed = hashlib.sha256(f"stale-bytes-{tag}-{i}".encode()).digest()
    return (seed * (size // 32 + 1))[:size]


def _put(store: DiskBackend, tag: str, ids: list[int], size: int) -> list[bool]:
    return store.put([_key(tag, i) for i in ids], [memoryview(_payload(tag, i, size)) for i in ids])


def _reads(store: DiskBackend, tag: str, i: int, size: int) -> bool:
    dst = memoryview(bytearray(size))
    hit = store.get([_key(tag, i)], [dst])[0]
    assert not hit or bytes(dst) == _payload(tag, i, size), f"{tag}-{i}: wrong bytes"
    return hit


class Killed(Exception):
    """The put's process died after writing its records."""


def _kill_after_data(phase: PutPhase) -> None:
    if phase is PutPhase.AFTER_DATA:
        raise Killed


def test_a_stale_header_after_the_largest_extent_is_passed_over(tmp_path: Path) -> None:
    record = HEADER_BYTES + OLD
    config = StorageConfig(
        backend="disk", path=str(tmp_path / "s"), max_bytes=PAGES * record, sync="none"
    )
    store = create("disk", config)
    assert isinstance(store, DiskBackend)
    try:
        assert all(_put(store, "old", list(range(PAGES)), OLD))  # slot n holds old page n
        for i in range(STALE):  # the pages before STALE are used: old-STALE is the oldest
            assert _reads(store, "old", i, OLD)
        # A put of "k" into the full store evicts old-STALE, writes k's record into its
        # slot, and dies before its commit: old-STALE's entry stays, over k's record.
        store.fault_hook = _kill_after_data
        with pytest.raises(Killed):
            _put(store, "k", [0], OLD)
        store.fault_hook = None
        # k is stored for real elsewhere (at the tail, where the last old page was).
        assert store.delete([_key("old", PAGES - 1)]) == 1
        assert _put(store, "k", [0], OLD) == [True]
        # Room by bytes for a page of the new size, but in one-slot holes only.
        assert store.delete([_key("old", i) for i in FREED]) == len(FREED)
        store.take_removed()
        assert _put(store, "new", [0], NEW) == [True]
        removed = store.take_removed()
        assert _key("k") not in removed, "room-making evicted the page a stale header names"
        assert _reads(store, "k", 0, OLD) and _reads(store, "new", 0, NEW)
        # What it evicted is bounded as disk.room says: one new slot, its alignment
        # and one old slot beyond the bytes the put needed (none here).
        new_cls, old_cls = slot_class(NEW, False), slot_class(OLD, False)
        assert len(removed) * record <= new_cls.stride + new_cls.align + old_cls.stride
        assert not _reads(store, "old", STALE, OLD)  # the stale entry: a miss, dropped
        assert _key("old", STALE) in store.take_removed()
    finally:
        store.close()
