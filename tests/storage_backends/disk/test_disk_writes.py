"""The disk store's put path: slots come as runs, a run's records take one ``pwritev``,
a run's index entries never replace a stored page, and the batch is one index
transaction (a failed commit leaves nothing of it)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import lmdb
import pytest

from storage_backends import StorageConfig, create
from storage_backends.disk import DiskBackend, PutPhase, writes
from storage_backends.disk.index import DiskIndex
from storage_backends.disk.layout import SlotClass, SlotRun, slot_class
from storage_backends.page_format import HEADER_BYTES

SIZE = 5000


def _key(i: int) -> bytes:
    return hashlib.sha256(f"writes-{i}".encode()).digest()


def _payload(i: int) -> bytes:
    return (hashlib.sha256(f"bytes-{i}".encode()).digest() * (SIZE // 32 + 1))[:SIZE]


def _config(path: Path, io_threads: int = 1) -> StorageConfig:
    return StorageConfig(
        backend="disk", path=str(path), max_bytes=4 << 20, sync="none", io_threads=io_threads
    )


def _index(path: Path) -> DiskIndex:
    path.mkdir(parents=True)
    return DiskIndex(path / "index", _config(path))


CLS = slot_class(SIZE, direct_io=False)


def test_free_slots_that_follow_each_other_come_back_as_one_run(tmp_path: Path) -> None:
    index = _index(tmp_path / "s")
    try:
        with index.writing() as writer:
            assert writer.reserve(CLS, 8, 8 * SIZE) == [SlotRun(0, 0, 8)]
            slots = SlotRun(0, 0, 8).slots(CLS.stride)
            for n in (5, 2, 3, 6):  # the last slot stays taken: the tail does not move
                writer.alloc.release(slots[n], CLS)
        with index.writing() as writer:
            assert writer.reserve(CLS, 3, 3 * SIZE) == [
                SlotRun(0, 2 * CLS.stride, 2),
                SlotRun(0, 5 * CLS.stride, 1),
            ]
            # What is left of the free run, then new slots from the tail.
            assert writer.reserve(CLS, 3, 3 * SIZE) == [
                SlotRun(0, 6 * CLS.stride, 1),
                SlotRun(0, 8 * CLS.stride, 2),
            ]
    finally:
        index.close()


def test_a_run_never_replaces_a_stored_page(tmp_path: Path) -> None:
    index = _index(tmp_path / "s")
    cls = SlotClass(CLS.stride, CLS.align)
    try:
        with index.writing() as writer:
            first = SlotRun(0, 0, 2)
            assert writer.insert_run(first, cls, [_key(0), _key(1)], [SIZE, SIZE]) == [True, True]
            again = SlotRun(0, 2 * cls.stride, 2)
            assert writer.insert_run(again, cls, [_key(1), _key(2)], [SIZE, SIZE - 1]) == [
                False,
                True,
            ]
            used = writer.bytes_used
        with index.writing() as writer:
            located = [writer.location(_key(i)) for i in range(3)]
        assert [loc.slot if loc else None for loc in located] == [
            *first.slots(cls.stride),
            again.slots(cls.stride)[1],
        ]
        assert located[2] is not None and located[2].payload_len == SIZE - 1
        assert used == sum(loc.record_len for loc in located if loc)
    finally:
        index.close()


@pytest.mark.parametrize(
    ("threads", "split", "calls"), [(1, 16 << 10, 1), (4, 16 << 10, 4), (4, 1 << 20, 1)]
)
def test_a_batch_of_adjacent_slots_is_one_pwritev_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int, split: int, calls: int
) -> None:
    """16 pages (80 KB) in adjacent slots: one ``pwritev`` for each thread that shares
    the batch, a thread for each ``SPLIT_BYTES`` of it (at most ``io_threads``)."""
    offsets: list[int] = []
    real = os.pwritev

    def counting(fd: int, bufs: list[memoryview], offset: int) -> int:
        offsets.append(offset)
        return real(fd, bufs, offset)

    monkeypatch.setattr(writes, "SPLIT_BYTES", split)
    store = create("disk", _config(tmp_path / "s", io_threads=threads))
    try:
        monkeypatch.setattr(os, "pwritev", counting)
        ids = range(16)
        assert all(store.put([_key(i) for i in ids], [memoryview(_payload(i)) for i in ids]))
        monkeypatch.setattr(os, "pwritev", real)
        assert len(offsets) == calls
        dst = [memoryview(bytearray(SIZE)) for _ in ids]
        assert all(store.get([_key(i) for i in ids], dst))
        assert [bytes(d) for d in dst] == [_payload(i) for i in ids]
    finally:
        store.close()


def test_a_failed_commit_leaves_nothing_of_the_batch(tmp_path: Path) -> None:
    """The whole batch is one transaction: when it cannot commit, no page of it is
    stored, the pages it evicted read back bit-exact or as misses (their slots may hold
    its records), and the next put finds room."""
    config = StorageConfig(
        backend="disk", path=str(tmp_path / "s"), max_bytes=8 * (SIZE + 64), sync="none"
    )
    store = DiskBackend(config)
    try:
        old = range(8)
        assert all(store.put([_key(i) for i in old], [memoryview(_payload(i)) for i in old]))

        def refuse(phase: PutPhase) -> None:
            if phase is PutPhase.IN_COMMIT:
                raise lmdb.MapFullError("planted: the index is full")

        store.fault_hook = refuse
        new = range(8, 12)  # evicts four old pages
        keys = [_key(i) for i in new]
        assert store.put(keys, [memoryview(_payload(i)) for i in new]) == [False] * 4
        store.fault_hook = None
        assert store.contains(keys) == [False] * 4
        assert store.stats().entries == 8
        dst = [memoryview(bytearray(SIZE)) for _ in old]
        hits = store.get([_key(i) for i in old], dst)
        assert all(
            not hit or bytes(d) == _payload(i) for i, hit, d in zip(old, hits, dst, strict=True)
        )
        assert hits[4:] == [True] * 4  # the pages it did not evict are all there
        assert all(store.put(keys, [memoryview(_payload(i)) for i in new]))
        back = [memoryview(bytearray(SIZE)) for _ in new]
        assert all(store.get(keys, back))
        assert [bytes(d) for d in back] == [_payload(i) for i in new]
    finally:
        store.close()


def test_a_batch_larger_than_a_segment_fills_new_segments_without_evicting(
    tmp_path: Path,
) -> None:
    size = 64 << 10  # 15 records fill a 1 MiB segment: 40 pages take three
    config = StorageConfig(
        backend="disk",
        path=str(tmp_path / "s"),
        max_bytes=8 << 20,
        sync="none",
        segment_bytes=1 << 20,
    )
    store = create("disk", config)
    try:
        old = [_key(1000 + i) for i in range(4)]
        assert all(store.put(old, [memoryview(bytes(size))] * 4))
        ids = range(40)
        payloads = [bytes([i]) * size for i in ids]
        assert all(store.put([_key(i) for i in ids], [memoryview(p) for p in payloads]))
        assert store.stats().evictions == 0
        assert store.contains(old) == [True] * 4
        dst = [memoryview(bytearray(size)) for _ in ids]
        assert all(store.get([_key(i) for i in ids], dst))
        assert [bytes(d) for d in dst] == payloads
    finally:
        store.close()


@pytest.mark.parametrize("batch", [1, 3])
def test_a_put_of_a_stored_page_makes_it_the_newest(tmp_path: Path, batch: int) -> None:
    """One page a call or several: a page put again is kept as the most recently used,
    so the next eviction takes the page after it; each phase of the put is announced."""
    record = HEADER_BYTES + SIZE
    config = StorageConfig(backend="disk", path=str(tmp_path / "s"), max_bytes=8 * record)
    store = DiskBackend(config)
    phases: list[PutPhase] = []
    try:
        for i in range(8):  # a full store, page 0 the oldest
            assert store.put([_key(i)], [memoryview(_payload(i))]) == [True]
        store.fault_hook = phases.append
        again = [0] + [100 + n for n in range(batch - 1)]  # page 0, and new pages beside it
        assert store.put([_key(i) for i in again], [memoryview(_payload(i)) for i in again])
        assert (
            phases
            == [PutPhase.BEFORE_DATA, PutPhase.AFTER_DATA, PutPhase.IN_COMMIT][
                : 3 if batch > 1 else 0
            ]
        )
        store.fault_hook = None
        phases.clear()
        store.fault_hook = phases.append
        assert store.put([_key(200)], [memoryview(_payload(200))]) == [True]
        assert phases == [PutPhase.BEFORE_DATA, PutPhase.AFTER_DATA, PutPhase.IN_COMMIT]
        evicted = set(store.take_removed())
        assert _key(0) not in evicted and _key(batch) in evicted
        assert store.contains([_key(0)]) == [True]
    finally:
        store.close()
