"""A PUT's records join the memory tier once the store holds them, when verified and held in
memory nothing else writes: received frames (kept as they are) and bytes; never a record
that fails its check, a shared-memory view, or a page that is not the one the store keeps."""

from __future__ import annotations

import mmap
from pathlib import Path

import pytest
import zmq

from hicache.config.daemon import StoreConfig
from hicache.daemon.admission import COPY_BELOW, keepable
from hicache.daemon.store import DaemonStore, scoped_key

from .conftest import ON_EVERY_STORE, page_key, page_record

BIG = COPY_BELOW  # a page whose record is kept as the frame it came in
SMALL = 4096  # copied: a small frame may share ZeroMQ's receive buffer


def _frame(record: bytes) -> memoryview:
    """A record as the socket thread hands it over: a received frame's buffer."""
    return zmq.Frame(record).buffer


def _damaged(record: bytes) -> bytes:
    raw = bytearray(record)
    raw[-1] ^= 0xFF  # the payload no longer hashes to the header's checksum
    return bytes(raw)


@pytest.fixture
def store(tmp_path: Path, daemon_backend: str):
    opened: list[DaemonStore] = []

    def make(memory_bytes: int = 4 << 20, max_bytes: int = 16 << 20) -> DaemonStore:
        config = StoreConfig(
            backend=daemon_backend,
            path=str(tmp_path / "store"),
            max_bytes=max_bytes,
            memory_bytes=memory_bytes,
        )
        opened.append(DaemonStore(config, max_page_bytes=1 << 20))
        return opened[-1]

    yield make
    for s in opened:
        s.close()


def test_keepable_keeps_frames_and_bytes_that_verify_and_nothing_a_client_may_write() -> None:
    key = page_key(0)
    big, small = page_record(key, 0, BIG), page_record(key, 1, SMALL)
    frame = _frame(big)
    kept = keepable(frame, key)
    assert isinstance(kept, memoryview) and kept.obj is frame.obj  # no copy
    copied = keepable(_frame(small), key)
    assert isinstance(copied, bytes) and copied == small
    assert keepable(small, key) is small
    assert keepable(_frame(_damaged(big)), key) is None  # checksum
    assert keepable(_frame(small), page_key(1)) is None  # another key's record
    slab = mmap.mmap(-1, len(big))
    slab[:] = big
    assert keepable(memoryview(slab), key) is None  # a shared-memory put area
    assert keepable(memoryview(bytearray(big)), key) is None  # a caller's buffer
    slab.close()


@ON_EVERY_STORE
@pytest.mark.parametrize("size", [SMALL, BIG])
def test_get_after_put_is_served_from_memory_only_for_verified_records(
    store, size: int, daemon_backend: str
) -> None:
    client = [page_key(i) for i in range(3)]
    records = [page_record(key, i, size) for i, key in enumerate(client)]
    records[2] = _damaged(records[2])
    scoped = [scoped_key("t", key) for key in client]
    s = store()
    assert s.put(scoped, [_frame(r) for r in records], client_keys=client) == [True] * 3
    assert s.size().store_entries == 3  # stored as it came: its first read drops it
    lookup = s.get(scoped, client, 1 << 30)
    assert [bytes(r) for r in lookup.records[:2] if r] == records[:2]
    assert lookup.records[2] is None and s.size().store_corrupt == 1
    # An lmdb store does not say which keys a put wrote: its pages wait for a second read.
    memory_hits = 2 if daemon_backend == "disk" else 0
    assert (lookup.memory_hits, lookup.store_hits) == (memory_hits, 2 - memory_hits)


@ON_EVERY_STORE
def test_a_page_held_before_keeps_its_bytes_in_both_tiers(store) -> None:
    key = page_key(0)
    first, second = page_record(key, 1, BIG), page_record(key, 2, BIG)
    scoped = [scoped_key("t", key)]
    s = store()
    assert s.put(scoped, [_frame(first)], client_keys=[key]) == [True]
    assert s.put(scoped, [_frame(second)], client_keys=[key]) == [True]  # first page wins
    for _ in range(3):  # first read: memory or store; later ones from memory
        assert [bytes(r) for r in s.get(scoped, [key], 1 << 30).records if r] == [first]


def test_a_record_not_kept_drops_an_older_page_of_its_key_from_memory(
    store, daemon_backend: str
) -> None:
    if daemon_backend != "disk":
        pytest.skip("only the disk store says which keys a put wrote")
    key, other = page_key(0), page_key(1)
    old, new = page_record(key, 1, BIG), page_record(key, 2, BIG)
    scoped = scoped_key("t", key)
    # A store of one page: putting another evicts the first from the store, while the
    # memory tier (larger) still holds it.
    s = store(memory_bytes=8 << 20, max_bytes=BIG + (BIG // 2))
    assert s.put([scoped], [_frame(old)], client_keys=[key]) == [True]
    other_record = page_record(other, 3, BIG)
    assert s.put([scoped_key("t", other)], [_frame(other_record)], client_keys=[other]) == [True]
    assert s.size().store_entries == 1 and s.cached([scoped]) is not None
    # The key stored again from memory a client may write (a shared-memory put area): the
    # store holds the new page, the memory tier must not go on serving the old one.
    slab = bytearray(new)
    assert s.put([scoped], [memoryview(slab)], client_keys=[key]) == [True]
    assert s.cached([scoped]) is None
    assert [bytes(r) for r in s.get([scoped], [key], 1 << 30).records if r] == [new]
