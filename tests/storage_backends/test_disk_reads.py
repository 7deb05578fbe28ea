"""The disk backend's get path: batches planned into runs of adjacent slots, each run
read with one preadv and every record checked; a run cut short by the end of its file
still serves the records it holds whole."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
import xxhash
from hypothesis import given
from hypothesis import strategies as st

from storage_backends import StorageConfig, create
from storage_backends.disk.layout import LOCATION_STRUCT
from storage_backends.disk.read_plan import GAP_MAX, plan_reads, plan_scattered, plan_uniform
from storage_backends.disk.records import check_run, checksums
from storage_backends.disk.scan import locate
from storage_backends.page_format import HEADER_BYTES, build_header


def _key(i: int) -> bytes:
    return hashlib.sha256(f"key-{i}".encode()).digest()


def _payload(i: int, size: int) -> bytes:
    return (hashlib.sha256(f"payload-{i}".encode()).digest() * (size // 32 + 1))[:size]


def _raw(segment: int, offset: int, stride: int, payload_len: int) -> bytes:
    return LOCATION_STRUCT.pack(segment, offset, stride, 64, payload_len, 7)


def test_adjacent_slots_form_one_run_in_file_order() -> None:
    rec = HEADER_BYTES + 100
    raws = [_raw(0, 2 * 160, 160, 100), _raw(0, 0, 160, 100), _raw(0, 160, 160, 100)]
    plan = plan_reads(raws, [100] * 3, 16)
    assert plan.damaged == []
    [run] = plan.runs
    assert (run.segment, run.offset, run.positions) == (0, 0, [1, 2, 0])
    assert (run.payload_lens, run.gaps) == ([100] * 3, [160 - rec] * 2)


def test_runs_break_at_holes_segments_bad_strides_and_the_cap() -> None:
    raws: list[bytes | None] = [
        _raw(0, 0, 200, 100),
        _raw(0, 200, 200 + GAP_MAX, 100),  # a gap no record has: nothing joins after it
        _raw(0, 400 + GAP_MAX, 200, 100),
        _raw(0, 800 + GAP_MAX, 200, 100),  # a hole before it
        _raw(1, 1000 + GAP_MAX, 200, 100),  # another segment
        None,  # absent
        b"not a location",  # damaged
        _raw(0, 1000 + GAP_MAX, 200, 99),  # stored with another length: a miss
    ]
    plan = plan_reads(raws, [100] * len(raws), 16)
    assert [r.positions for r in plan.runs] == [[0, 1], [2], [3], [4]]
    assert plan.damaged == [6]
    assert plan.aging == []  # every stamp (7) is young by default
    assert plan_reads(raws, [100] * len(raws), 16, young_from=8).aging == [0, 1, 2, 3, 4]
    same = [_raw(0, n * 200, 200, 100) for n in range(8)]
    assert [r.positions for r in plan_reads(same, [100] * 8, 3).runs] == [
        [0, 1, 2],
        [3, 4, 5],
        [6, 7],
    ]
    with pytest.raises(ValueError):
        plan_reads(same, [100] * 8, 0)


_slots = st.lists(
    st.tuples(st.integers(0, 1), st.integers(0, 12), st.sampled_from([100, 120, 99])),
    max_size=24,
)


@given(_slots, st.integers(1, 5))
def test_a_plan_reads_each_wanted_record_once_from_where_it_lies(
    slots: list[tuple[int, int, int]], max_run: int
) -> None:
    stride = 192
    raws = [_raw(seg, n * stride, stride, length) for seg, n, length in slots]
    plan = plan_reads(raws, [100] * len(raws), max_run)
    planned = [pos for run in plan.runs for pos in run.positions]
    assert sorted(planned) == [i for i, (_, _, length) in enumerate(slots) if length == 100]
    for run in plan.runs:
        assert 1 <= len(run.positions) <= max_run
        assert len(run.gaps) == len(run.positions) - 1
        offset = run.offset
        for k, pos in enumerate(run.positions):
            assert slots[pos][0] == run.segment and slots[pos][1] * stride == offset
            offset += HEADER_BYTES + run.payload_lens[k] + (run.gaps[k] if k < len(run.gaps) else 0)


_BREAKS = st.sampled_from(["none", "absent", "damaged", "segment", "length", "swap", "hole"])


@given(
    st.integers(1, 20),
    st.sampled_from([(160, 100), (4096, 3000), (192, 100)]),
    st.integers(1, 6),
    st.lists(st.tuples(_BREAKS, st.integers(0, 19)), max_size=2),
    st.integers(0, 30),
)
def test_the_uniform_plan_is_the_scattered_plan_where_it_applies(
    n: int, shape: tuple[int, int], max_run: int, breaks: list[tuple[str, int]], young: int
) -> None:
    stride, length = shape
    slots = [[0, 4096 + k * stride, stride, length] for k in range(n)]
    for kind, at in breaks:  # each break makes the batch no longer uniform
        at %= n
        if kind == "segment":
            slots[at][0] = 1
        elif kind == "length":
            slots[at][3] = length - 1
        elif kind == "swap" and n > 1:
            slots[at], slots[(at + 1) % n] = slots[(at + 1) % n], slots[at]
        elif kind == "hole":
            slots[at][1] += stride * n
    raws = [
        LOCATION_STRUCT.pack(seg, off, st_, 64, ln, 10 + k)
        for k, (seg, off, st_, ln) in enumerate(slots)
    ]
    for kind, at in breaks:
        if kind == "absent":
            raws[at % n] = None
        elif kind == "damaged":
            raws[at % n] = b"short"
    lengths = [length] * n
    uniform = plan_uniform(raws, lengths, max_run, young)
    scattered = plan_scattered(raws, lengths, max_run, young)
    if all(kind == "none" or (kind == "swap" and n == 1) for kind, _ in breaks):
        assert uniform is not None
    if uniform is not None:
        assert all(run.uniform for run in uniform.runs)
        assert [run._replace(uniform=False) for run in uniform.runs] == scattered.runs
        assert (uniform.damaged, uniform.aging) == (scattered.damaged, scattered.aging)
    assert plan_reads(raws, lengths, max_run, young) == (uniform or scattered)


def test_check_run_refuses_a_wrong_key_length_or_checksum() -> None:
    payloads = [_payload(i, 64) for i in range(4)]
    headers = bytearray(b"".join(build_header(_key(i), p) for i, p in enumerate(payloads)))
    dst = [memoryview(bytearray(p)) for p in payloads]
    keys = [_key(i) for i in range(4)]
    assert check_run(headers, keys, [64] * 4, checksums([dst])) == [True] * 4
    dst[1][63] ^= 1  # the payload's last byte
    keys[2] = _key(9)
    lens = [64, 64, 64, 63]
    assert check_run(headers, keys, lens, checksums([dst])) == [True, False, False, False]


def test_checksums_of_pages_in_several_runs_are_those_of_their_bytes() -> None:
    payloads = [_payload(i, 100) for i in range(3)]
    columns = [[memoryview(p[:30]) for p in payloads], [memoryview(p[30:]) for p in payloads]]
    assert checksums(columns) == [xxhash.xxh3_64_intdigest(p) for p in payloads]


def _store(path: Path, threads: int = 1):
    config = StorageConfig(
        backend="disk", path=str(path), max_bytes=16 << 20, sync="none", io_threads=threads
    )
    return create("disk", config)


@pytest.mark.parametrize("size", [8192, 300 << 10, 1536 << 10])  # packed, aligned, a run each
def test_a_run_cut_by_the_end_of_its_file_serves_the_records_before_the_cut(
    tmp_path: Path, size: int
) -> None:
    n = 6
    keys = [_key(i) for i in range(n)]
    store = _store(tmp_path / "s")
    assert all(store.put(keys, [memoryview(_payload(i, size)) for i in range(n)]))
    store.close()
    place = locate(tmp_path / "s", keys[3])
    assert place is not None
    os.truncate(place.segment, place.offset + place.length - 1)
    store = _store(tmp_path / "s")
    try:
        dst = [memoryview(bytearray(size)) for _ in range(n)]
        assert store.get(keys, dst) == [True, True, True, False, False, False]
        assert [bytes(d) for d in dst[:3]] == [_payload(i, size) for i in range(3)]
        assert store.stats().corrupt == 3
    finally:
        store.close()


@pytest.mark.parametrize("threads", [1, 4])
def test_batches_split_across_threads_read_every_page_into_its_own_buffer(
    tmp_path: Path, threads: int
) -> None:
    size, n = 64 << 10, 48  # 3 MiB: more than one thread's share
    keys = [_key(i) for i in range(n)]
    store = _store(tmp_path / "s", threads)
    try:
        for start in (0, 16, 32):  # three put batches: three stretches of the segment
            span = range(start, start + 16)
            assert all(
                store.put([keys[i] for i in span], [memoryview(_payload(i, size)) for i in span])
            )
        order = list(range(n))[::-1]
        dst = [memoryview(bytearray(size)) for _ in order]
        assert all(store.get([keys[i] for i in order], dst))
        assert [bytes(d) for d in dst] == [_payload(i, size) for i in order]
        scatter = [[memoryview(bytearray(1000)), memoryview(bytearray(size - 1000))] for _ in keys]
        assert all(store.get_scatter(keys, scatter))  # type: ignore[attr-defined]
        assert [b"".join(map(bytes, runs)) for runs in scatter] == [
            _payload(i, size) for i in range(n)
        ]
    finally:
        store.close()


def _injure(root: Path, keys: list[bytes], how: str) -> None:
    """Damage the closed store at ``root``: a payload byte of page 1 and a key byte of
    page 3 flipped, or the segment cut inside page 4."""
    if how == "truncate":
        place = locate(root, keys[4])
        assert place is not None
        os.truncate(place.segment, place.offset + place.length - 1)
        return
    for i, at in ((1, HEADER_BYTES + 5), (3, 8)):
        place = locate(root, keys[i])
        assert place is not None
        with open(place.segment, "r+b") as f:
            f.seek(place.offset + at)
            byte = f.read(1)[0]
            f.seek(place.offset + at)
            f.write(bytes([byte ^ 0xFF]))


@pytest.mark.parametrize("how", ["flip", "truncate"])
@pytest.mark.parametrize("size", [8192, 300 << 10])
def test_one_page_gets_have_the_outcomes_of_one_batch(tmp_path: Path, how: str, size: int) -> None:
    """Pages read one per call (their own shorter path) and in one batch: the same hits,
    bytes, damage counts and dropped keys, on a store with damaged, absent and
    other-length pages."""
    n = 6
    keys = [_key(i) for i in range(n)]
    store = _store(tmp_path / "s")
    assert all(store.put(keys[:5], [memoryview(_payload(i, size)) for i in range(5)]))
    store.close()  # page 5 is absent; page 2 is asked for with another length below
    _injure(tmp_path / "s", keys, how)
    lengths = [size, size, size - 1, size, size, size]
    outcomes = []
    for name, one_by_one in (("batch", False), ("single", True)):
        shutil.copytree(tmp_path / "s", tmp_path / name)
        copy = _store(tmp_path / name)
        try:
            dst = [memoryview(bytearray(length)) for length in lengths]
            if one_by_one:
                hits = [copy.get([key], [view])[0] for key, view in zip(keys, dst, strict=True)]
            else:
                hits = copy.get(keys, dst)
            got = [bytes(view) if hit else None for view, hit in zip(dst, hits, strict=True)]
            outcomes.append((hits, got, copy.stats().corrupt, copy.contains(keys)))
        finally:
            copy.close()
    assert outcomes[0] == outcomes[1]
    damaged = (1, 3) if how == "flip" else (4,)
    assert outcomes[0][0] == [i not in (*damaged, 2, 5) for i in range(n)]
    assert outcomes[0][2] == len(damaged)
