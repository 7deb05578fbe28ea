"""Spans of adjacent slots: one pwritev per span must put every record of the span in its
own slot, whatever order or subset a later batch reads."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from storage_backends import StorageConfig, create
from storage_backends.disk.layout import SlotRun
from storage_backends.disk.runs import GAP_MAX, Span, gap, spans
from storage_backends.disk.scan import locate
from storage_backends.page_format import encode_page


def _key(i: int) -> bytes:
    return hashlib.sha256(f"key-{i}".encode()).digest()


def _payload(i: int, size: int) -> bytes:
    return (hashlib.sha256(f"payload-{i}".encode()).digest() * (size // 32 + 1))[:size]


def _config(path: Path) -> StorageConfig:
    return StorageConfig(backend="disk", path=str(path), max_bytes=4 << 20, sync="none")


def test_spans_follow_the_runs_in_order_and_number_the_pages_across_them() -> None:
    runs = [SlotRun(0, 300, 2), SlotRun(0, 0, 1), SlotRun(1, 100, 3)]
    assert spans(runs, 100, 3, 1) == [
        Span(0, 300, 0, 2),
        Span(0, 0, 2, 1),
        Span(1, 100, 3, 3),
    ]


def test_spans_cut_runs_into_the_thread_share_and_the_iovec_limit() -> None:
    assert spans([SlotRun(0, 0, 8)], 100, 3, 4) == [Span(0, n * 200, 2 * n, 2) for n in range(4)]
    # A run longer than the kernel takes in one pwritev is cut however few the threads.
    many = spans([SlotRun(2, 0, 5000)], 10, 3, 1)
    assert sum(span.n_records for span in many) == 5000
    assert max(span.n_records for span in many) * 3 <= os.sysconf("SC_IOV_MAX")
    assert [span.first for span in many] == [span.offset // 10 for span in many]


@pytest.mark.parametrize("threads", [1, 4])
def test_records_written_span_by_span_are_the_one_shot_records(
    tmp_path: Path, threads: int
) -> None:
    """Each record on disk, written span by span on the I/O pool, is byte for byte the
    header (one-shot xxh3 of the payload) and payload that ``encode_page`` builds."""
    size = (1 << 20) + 12345  # not a multiple of the alignment: gaps between records
    n = 7
    config = StorageConfig(
        backend="disk",
        path=str(tmp_path / "store"),
        max_bytes=64 << 20,
        sync="none",
        io_threads=threads,
    )
    store = create("disk", config)
    keys = [_key(i) for i in range(n)]
    payloads = [_payload(i, size) for i in range(n)]
    try:
        assert all(store.put(keys, [memoryview(p) for p in payloads]))
    finally:
        store.close()
    for key, payload in zip(keys, payloads, strict=True):
        place = locate(tmp_path / "store", key)
        assert place is not None
        with open(place.segment, "rb") as f:
            f.seek(place.offset)
            assert f.read(place.length) == encode_page(key, payload)


def test_a_gap_is_shorter_than_one_alignment_unit() -> None:
    assert len(gap(GAP_MAX - 1)) == GAP_MAX - 1
    with pytest.raises(ValueError):
        gap(GAP_MAX)


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
