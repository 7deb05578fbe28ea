"""Runs of adjacent slots: one pwritev per run must put every record of the run in its
own slot, whatever order or subset a later batch reads."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from storage_backends import StorageConfig, create
from storage_backends.disk.runs import GAP_MAX, Extent, plan_runs
from storage_backends.disk.scan import locate


def _key(i: int) -> bytes:
    return hashlib.sha256(f"key-{i}".encode()).digest()


def _payload(i: int, size: int) -> bytes:
    return (hashlib.sha256(f"payload-{i}".encode()).digest() * (size // 32 + 1))[:size]


def _config(path: Path) -> StorageConfig:
    return StorageConfig(backend="disk", path=str(path), max_bytes=4 << 20, sync="none")


def test_adjacent_slots_form_one_run_in_offset_order() -> None:
    extents = [Extent(0, 200, 90, 100), Extent(0, 0, 90, 100), Extent(0, 100, 90, 100)]
    runs = plan_runs(extents, 3, 1)
    assert [(r.segment, r.offset, r.members) for r in runs] == [(0, 0, [1, 2, 0])]


def test_runs_break_at_holes_segments_bad_strides_and_the_thread_share() -> None:
    extents = [
        Extent(0, 0, 90, 100),
        Extent(0, 100, 90, 100 + GAP_MAX),  # a stride no record has: nothing joins after it
        Extent(0, 200 + GAP_MAX, 90, 100),
        Extent(0, 400 + GAP_MAX, 90, 100),  # a hole before it
        Extent(1, 500 + GAP_MAX, 90, 100),  # another segment
    ]
    assert [r.members for r in plan_runs(extents, 3, 1)] == [[0, 1], [2], [3], [4]]
    same = [Extent(0, n * 100, 90, 100) for n in range(8)]
    assert [r.members for r in plan_runs(same, 3, 4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_any_order_and_subset_reads_back_what_one_batch_wrote(tmp_path: Path) -> None:
    sizes = [5000] * 6 + [12000] * 4  # two slot classes in one batch
    store = create("disk", _config(tmp_path / "store"))
    try:
        payloads = [_payload(i, size) for i, size in enumerate(sizes)]
        keys = [_key(i) for i in range(len(sizes))]
        assert all(store.put(keys, [memoryview(p) for p in payloads]))
        for order in ([9, 3, 1, 0, 7, 2], list(range(len(sizes)))[::-1], [4, 4, 5]):
            dst = [memoryview(bytearray(sizes[i])) for i in order]
            assert all(store.get([keys[i] for i in order], dst))
            assert [bytes(d) for d in dst] == [payloads[i] for i in order]
    finally:
        store.close()


def test_a_segment_cut_inside_a_run_keeps_the_records_before_the_cut(tmp_path: Path) -> None:
    path = tmp_path / "store"
    store = create("disk", _config(path))
    payloads = [_payload(i, 5000) for i in range(8)]
    assert all(store.put([_key(i) for i in range(8)], [memoryview(p) for p in payloads]))
    store.close()
    place = locate(path, _key(5))
    assert place is not None
    os.truncate(place.segment, place.offset + place.length // 2)
    store = create("disk", _config(path))
    try:
        # Buffers already holding the right bytes: only the bytes read may count.
        dst = [memoryview(bytearray(p)) for p in payloads]
        assert store.get([_key(i) for i in range(8)], dst) == [i < 5 for i in range(8)]
        assert [bytes(d) for d in dst[:5]] == payloads[:5]
    finally:
        store.close()
