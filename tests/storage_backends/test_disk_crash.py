"""``kill -9`` of a disk-store writer at each phase of a put, then a reopen: every
acknowledged page is served bit-exact, the unacknowledged batch is absent or
bit-exact, the next write works, and the space the dead put reserved comes back."""

from __future__ import annotations

import hashlib
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest

from storage_backends import StorageConfig, create
from storage_backends.disk import PutPhase
from storage_backends.disk.index import DB_NAMES, DiskIndex
from storage_backends.disk.layout import INDEX_DIR, SlotRun, slot_class
from storage_backends.page_format import HEADER_BYTES

SIZE = 4096
BATCH = 4
KILLED_BATCH = 3  # batches 0..2 are acknowledged first
CAPACITY_PAGES = 24

WRITER = """
import hashlib, os, signal, sys
from storage_backends import StorageConfig
from storage_backends.disk import DiskBackend, PutPhase

path, phase, size, batch, killed, capacity, last_size = sys.argv[1:8]
size, batch, killed, capacity = int(size), int(batch), int(killed), int(capacity)
last_size = int(last_size)  # the page size of the killed batch
store = DiskBackend(StorageConfig(backend="disk", path=path, max_bytes=capacity, sync="none"))
calls = []

def hook(at):
    if at is PutPhase(phase):
        calls.append(at)
        if len(calls) > killed:
            os.kill(os.getpid(), signal.SIGKILL)

def key(i):
    return hashlib.sha256(f"page-{i}".encode()).digest()

def payload(i, size):
    seed = hashlib.sha256(f"payload-{i}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]

store.fault_hook = hook
for b in range(killed + 1):
    ids = range(b * batch, (b + 1) * batch)
    n = last_size if b == killed else size
    done = store.put([key(i) for i in ids], [memoryview(payload(i, n)) for i in ids])
    print("ack", b, "".join("1" if ok else "0" for ok in done), flush=True)
print("not killed", flush=True)
"""


def _key(i: int) -> bytes:
    return hashlib.sha256(f"page-{i}".encode()).digest()


def _payload(i: int, size: int = SIZE) -> bytes:
    seed = hashlib.sha256(f"payload-{i}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def _config(path: Path) -> StorageConfig:
    capacity = CAPACITY_PAGES * (SIZE + HEADER_BYTES)
    return StorageConfig(backend="disk", path=str(path), max_bytes=capacity, sync="none")


def _run_writer(
    path: Path, phase: PutPhase, killed_batch: int = KILLED_BATCH, last_size: int = SIZE
) -> set[int]:
    """Run the writer until the fault hook kills it in batch ``killed_batch`` (of pages
    of ``last_size``); the acknowledged page ids."""
    args = [path, phase.value, SIZE, BATCH, killed_batch, _config(path).max_bytes, last_size]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run(
        [sys.executable, "-c", WRITER, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr
    acked: set[int] = set()
    for line in done.stdout.splitlines():
        _, batch, bits = line.split()
        start = int(batch) * BATCH
        acked |= {start + n for n, bit in enumerate(bits) if bit == "1"}
    return acked


@pytest.mark.parametrize("phase", list(PutPhase))
def test_kill_at_each_phase_loses_nothing_acknowledged(tmp_path: Path, phase: PutPhase) -> None:
    path = tmp_path / "store"
    acked = _run_writer(path, phase)
    assert acked == set(range(KILLED_BATCH * BATCH))
    store = create("disk", _config(path))
    try:
        ids = range((KILLED_BATCH + 1) * BATCH)
        dst = [memoryview(bytearray(SIZE)) for _ in ids]
        hits = store.get([_key(i) for i in ids], dst)
        for i, hit, buf in zip(ids, hits, dst, strict=True):
            assert hit or i not in acked, f"acknowledged page {i} lost after a kill at {phase}"
            assert not hit or bytes(buf) == _payload(i), f"page {i} is not its own bytes"
        assert store.stats().corrupt == 0
        # The space the killed put reserved is free again: the store fills to capacity.
        fresh = range(100, 100 + CAPACITY_PAGES)
        assert all(store.put([_key(i) for i in fresh], [memoryview(_payload(i)) for i in fresh]))
        assert store.stats().entries == CAPACITY_PAGES
        back = [memoryview(bytearray(SIZE)) for _ in fresh]
        assert all(store.get([_key(i) for i in fresh], back))
        assert all(bytes(b) == _payload(i) for i, b in zip(fresh, back, strict=True))
    finally:
        store.close()


@pytest.mark.parametrize("phase", [PutPhase.AFTER_DATA, PutPhase.IN_COMMIT])
def test_a_kill_in_a_put_that_evicts_costs_only_what_it_evicted(
    tmp_path: Path, phase: PutPhase
) -> None:
    """A full store: the killed batch evicts the oldest pages and writes into their
    slots, uncommitted. Their entries survive the kill and now point at the killed
    batch's records: they read as misses, never as other bytes; every other
    acknowledged page is served bit-exact."""
    path = tmp_path / "store"
    full = CAPACITY_PAGES // BATCH
    acked = _run_writer(path, phase, killed_batch=full)
    assert acked == set(range(CAPACITY_PAGES))
    store = create("disk", _config(path))
    try:
        ids = range((full + 1) * BATCH)
        dst = [memoryview(bytearray(SIZE)) for _ in ids]
        hits = store.get([_key(i) for i in ids], dst)
        for i, hit, buf in zip(ids, hits, dst, strict=True):
            assert not hit or bytes(buf) == _payload(i), f"page {i} is not its own bytes"
            assert hit or i < BATCH or i not in acked, f"page {i} lost, the kill evicted {BATCH}"
        fresh = range(100, 100 + CAPACITY_PAGES)
        assert all(store.put([_key(i) for i in fresh], [memoryview(_payload(i)) for i in fresh]))
        assert store.stats().entries == CAPACITY_PAGES
    finally:
        store.close()


@pytest.mark.parametrize("phase", [PutPhase.AFTER_DATA, PutPhase.IN_COMMIT])
def test_a_kill_in_a_put_of_a_new_size_costs_only_what_it_evicted(
    tmp_path: Path, phase: PutPhase
) -> None:
    """A full store and a killed batch of larger pages: it evicts the pages that stand
    after free space (not the oldest) and writes over their slots, uncommitted. Those
    pages read as misses, never as other bytes; no more are lost than the batch could
    evict; the store then takes pages of the new size."""
    path = tmp_path / "store"
    full, new_size = CAPACITY_PAGES // BATCH, 2 * SIZE + 1000
    acked = _run_writer(path, phase, killed_batch=full, last_size=new_size)
    assert acked == set(range(CAPACITY_PAGES))
    store = create("disk", _config(path))
    try:
        ids = range(CAPACITY_PAGES)
        dst = [memoryview(bytearray(SIZE)) for _ in ids]
        hits = store.get([_key(i) for i in ids], dst)
        for i, hit, buf in zip(ids, hits, dst, strict=True):
            assert not hit or bytes(buf) == _payload(i), f"page {i} is not its own bytes"
        # By bytes the batch needs about 2.25 old slots a page, by room at most 4.
        assert hits.count(False) <= 4 * BATCH + 1
        new = range(CAPACITY_PAGES + BATCH, CAPACITY_PAGES + 3 * BATCH)
        src = [memoryview(_payload(i, new_size)) for i in new]
        assert all(store.put([_key(i) for i in new], src))
        back = [memoryview(bytearray(new_size)) for _ in new]
        assert all(store.get([_key(i) for i in new], back))
        assert all(bytes(b) == _payload(i, new_size) for i, b in zip(new, back, strict=True))
    finally:
        store.close()


def test_slots_a_first_version_put_left_reserved_come_back_at_open(tmp_path: Path) -> None:
    """The first version of the store committed a batch's reservation (owner -> slots in
    the ``pending`` table) before writing; a kill then left it there. Such a store opens
    with the slots free again: it fills to capacity without evicting."""
    path = tmp_path / "store"
    config = _config(path)
    cls = slot_class(SIZE, direct_io=False)
    path.mkdir()
    index = DiskIndex(path / INDEX_DIR, config)
    try:
        with index.writing() as writer:
            runs = writer.reserve(cls, BATCH, BATCH * (SIZE + HEADER_BYTES))
    finally:
        index.close()
    assert runs == [SlotRun(0, 0, BATCH)]
    env = lmdb.open(str(path / INDEX_DIR), max_dbs=len(DB_NAMES))
    try:
        pending = env.open_db(b"pending")
        record = b"".join(
            struct.pack(">IQIH", slot.segment, slot.offset, *cls)
            for slot in runs[0].slots(cls.stride)
        )
        with env.begin(write=True) as txn:
            txn.put(struct.pack(">IQ", 2**31 - 1, 7), record, db=pending)
    finally:
        env.close()
    store = create("disk", config)
    try:
        ids = range(CAPACITY_PAGES)
        assert all(store.put([_key(i) for i in ids], [memoryview(_payload(i)) for i in ids]))
        assert store.stats().entries == CAPACITY_PAGES
        assert store.stats().evictions == 0
    finally:
        store.close()
