"""Pages of a new size in a disk store full of pages of another size (a second model on
a shared store, a model upgrade): the put evicts about the bytes it needs, never the
whole store, and the store stays within ``max_bytes``."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from storage_backends import StorageBackend, StorageConfig, create
from storage_backends.disk.layout import BLOCK, SEGMENT_PREFIX, round_up, slot_class
from storage_backends.page_format import HEADER_BYTES

OLD, NEW = 16384, 20000


def _key(kind: str, i: int) -> bytes:
    return hashlib.sha256(f"classes-{kind}-{i}".encode()).digest()


def _payload(kind: str, i: int, size: int) -> bytes:
    return (hashlib.sha256(f"{kind}-{i}".encode()).digest() * (size // 32 + 1))[:size]


def _record(size: int) -> int:
    return HEADER_BYTES + size


def _stride(size: int) -> int:
    return slot_class(size, direct_io=False).stride


def _config(path: Path, max_bytes: int) -> StorageConfig:
    return StorageConfig(
        backend="disk", path=str(path), max_bytes=max_bytes, sync="none", segment_bytes=8 << 20
    )


def _put(store: StorageBackend, kind: str, ids: list[int], size: int) -> None:
    for at in range(0, len(ids), 16):
        chunk = ids[at : at + 16]
        src = [memoryview(_payload(kind, i, size)) for i in chunk]
        assert all(store.put([_key(kind, i) for i in chunk], src))


def _file_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.glob(f"{SEGMENT_PREFIX}*"))


def _reorder(store: StorageBackend, pages: int, size: int, how: str, seed: int) -> None:
    """Make age differ from place among ``pages`` old pages of ``size`` put in order:
    "scattered": half of them deleted at random and the holes refilled; "alternate":
    every other page read, so that the least recently used ones never lie together."""
    if how == "scattered":
        gone = random.Random(seed).sample(range(pages), pages // 2)
        assert store.delete([_key("old", i) for i in gone]) == len(gone)
        _put(store, "old", list(range(pages, pages + len(gone))), size)
    elif how == "alternate":
        read = list(range(0, pages, 2))
        dst = [memoryview(bytearray(size)) for _ in read]
        assert all(store.get([_key("old", i) for i in read], dst))
    store.take_removed()


HOW = ["in order", "scattered", "alternate"]


@pytest.mark.parametrize("pages", [40, 400])
@pytest.mark.parametrize("how", HOW)
def test_a_new_page_size_evicts_about_what_it_needs(tmp_path: Path, pages: int, how: str) -> None:
    """The audit's case: 4 pages of a new size into a store full of another evicted all
    40 (and 400 of 400) pages."""
    max_bytes = pages * _record(OLD)
    store = create("disk", _config(tmp_path / "s", max_bytes))
    try:
        _put(store, "old", list(range(pages)), OLD)
        _reorder(store, pages, OLD, how, seed=pages)
        _put(store, "new", list(range(4)), NEW)
        evicted = len(store.take_removed())
        # By bytes alone 5 old pages make room for 4 new ones; room for each new slot
        # costs at most one new slot and one old slot more.
        assert evicted <= 5 + 4 * (-(-_stride(NEW) // _stride(OLD)) + 1)
        stats = store.stats()
        assert stats.entries == pages + 4 - evicted
        assert stats.bytes_used <= max_bytes
        assert _file_bytes(tmp_path / "s") <= round_up(max_bytes + _stride(NEW), BLOCK)
        dst = [memoryview(bytearray(NEW)) for _ in range(4)]
        assert all(store.get([_key("new", i) for i in range(4)], dst))
        assert [bytes(d) for d in dst] == [_payload("new", i, NEW) for i in range(4)]
    finally:
        store.close()


SIZES = (3000, 5000, 16384, 20000, 60000, 204800)  # the last: 4 KiB-aligned slots


@given(
    seed=st.integers(0, 2**16),
    sizes=st.lists(st.sampled_from(SIZES), min_size=2, max_size=2, unique=True),
    count=st.integers(1, 6),
    how=st.sampled_from(HOW),
)
# Every run: a batch of three new pages whose room-making meets the batch's own slots
# (taken, not yet written: an evicted page's stale header) right after a free extent.
@example(seed=0, sizes=[3000, 16384], count=3, how="alternate")
@settings(max_examples=25, deadline=None)
def test_room_for_a_new_size_is_bounded(
    tmp_path_factory: pytest.TempPathFactory,
    seed: int,
    sizes: list[int],
    count: int,
    how: str,
) -> None:
    """Whatever the two sizes and the order pages came and went in, a put of ``count``
    pages of the new size evicts at most: what its bytes need beyond the free bytes
    (plus the one page that crosses the line), then per new slot one new slot, its
    alignment and one old slot."""
    old, new = sizes
    pages = max(24, 12 * _record(new) // _record(old))
    max_bytes = pages * _stride(old)  # the old pages fill it without evicting
    path = tmp_path_factory.mktemp("room") / "s"
    store = create("disk", _config(path, max_bytes))
    try:
        _put(store, "old", list(range(pages)), old)
        _reorder(store, pages, old, how, seed)
        before = store.stats().bytes_used
        src = [memoryview(_payload("new", i, new)) for i in range(count)]
        assert all(store.put([_key("new", i) for i in range(count)], src))
        evicted = len(store.take_removed()) * _record(old)
        need = max(0, before + count * _record(new) - max_bytes)
        cls = slot_class(new, direct_io=False)
        per_slot = cls.stride + cls.align + _stride(old)
        assert evicted <= need + _record(old) + count * per_slot, (evicted, pages)
        assert store.stats().bytes_used <= max_bytes
        largest = max(cls.stride, _stride(old))  # the store may pass max_bytes by one slot
        assert _file_bytes(path) <= round_up(max_bytes + largest, BLOCK)
    finally:
        store.close()


def test_a_store_full_of_padded_slots_keeps_taking_puts(tmp_path: Path) -> None:
    """100-byte pages take 192-byte slots: the store's slots fill while its bytes stay
    a fifth below ``max_bytes``, so only the slots call for evictions (there is no free
    extent to grow: the oldest pages go, as many as needed)."""
    pages, size = 1000, 100
    store = create("disk", _config(tmp_path / "s", pages * _record(size)))
    try:
        _put(store, "small", list(range(3 * pages)), size)
        assert store.stats().put_failures == 0
        assert store.stats().entries >= pages * _record(size) // _stride(size)  # still full
    finally:
        store.close()
