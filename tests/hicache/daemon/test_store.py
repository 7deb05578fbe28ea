"""DaemonStore and ByteLRU in process: tenant scoping, bounds, read-through, damage, races."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hicache.config.daemon import StoreConfig
from hicache.daemon.memory_lru import ENTRY_OVERHEAD, GHOST_SPAN, MIN_GHOSTS, ByteLRU
from hicache.daemon.record_store import OPENERS
from hicache.daemon.store import DaemonStore, scoped_key, tenant_store_path
from storage_backends.errors import StorageWriteError
from storage_backends.page_format import HEADER_BYTES
from storage_backends.store_kind import detect

from .conftest import ON_EVERY_STORE, page_key, page_record, write_wrapped


@pytest.fixture
def store(tmp_path: Path, daemon_backend: str):
    opened: list[DaemonStore] = []

    def make(
        memory_bytes: int = 1 << 20,
        quotas: dict[str, int] | None = None,
        max_bytes: int = 16 << 20,
        backend: str = daemon_backend,
    ) -> DaemonStore:
        config = StoreConfig(
            backend=backend,
            path=str(tmp_path / "store"),
            max_bytes=max_bytes,
            memory_bytes=memory_bytes,
        )
        opened.append(DaemonStore(config, max_page_bytes=1 << 20, quotas=quotas))
        return opened[-1]

    yield make
    for s in opened:
        s.close()


def test_scoped_keys_separate_tenants() -> None:
    key = page_key(0)
    assert scoped_key("a", key) != scoped_key("b", key)
    assert len(scoped_key("a", key)) == 32


@ON_EVERY_STORE
def test_store_reads_through_memory_and_survives_reopen(store) -> None:
    client_keys = [page_key(i) for i in range(8)]
    records = [page_record(key, i, size=4096) for i, key in enumerate(client_keys)]
    keys = [scoped_key("t", key) for key in client_keys]
    s = store(memory_bytes=3 * (4096 + 56 + ENTRY_OVERHEAD))  # room for three pages
    assert s.put(keys, records) == [True] * 8
    size = s.size()  # a PUT does not fill the memory tier
    assert size.memory_entries == 0 and size.store_entries == 8
    for memory_hits, store_hits in ((0, 8), (0, 8), (3, 5)):  # cached on the second read
        lookup = s.get(keys, client_keys, 1 << 30)
        assert [bytes(r) for r in lookup.records if r is not None] == records
        assert (lookup.memory_hits, lookup.store_hits) == (memory_hits, store_hits)
    size = s.size()
    assert size.memory_entries == 3 and size.memory_evictions == 5
    assert s.exists(keys) == 8
    assert s.delete([keys[0], keys[0], scoped_key("t", b"none")]) == 1
    assert s.exists(keys) == 0
    capped = s.get(keys[1:], client_keys[1:], max_bytes=2 * len(records[0]) + 10)
    assert capped.records == [*records[1:3], *[None] * 5]  # later keys: misses, not read
    s.close()
    reopened = store()
    assert reopened.get(keys[1:], client_keys[1:], 1 << 30).records == records[1:]


@ON_EVERY_STORE
def test_damaged_stored_page_is_a_miss_and_counted(store, tmp_path: Path) -> None:
    client_key = page_key(1)
    record = page_record(client_key, 7, size=4096)
    s = store()
    assert s.put([scoped_key("t", client_key)], [record]) == [True]
    s.close()
    damaged = 0
    for data in (tmp_path / "store").rglob("*"):  # lmdb: data.mdb; disk: a segment file
        raw = bytearray(data.read_bytes()) if data.is_file() else bytearray()
        at = raw.find(record[-64:])
        if at > 0:
            raw[at] ^= 0xFF
            data.write_bytes(bytes(raw))
            damaged += 1
    assert damaged == 1
    reopened = store()
    lookup = reopened.get([scoped_key("t", client_key)], [client_key], 1 << 30)
    assert lookup.records == [None]
    assert reopened.size().store_corrupt == 1 and reopened.size().store_entries == 0


def test_lru_is_bounded_and_refuses_stale_read_through() -> None:
    lru = ByteLRU(capacity=2 * (100 + ENTRY_OVERHEAD))
    assert lru.put(b"a", b"x" * 100) and lru.put(b"b", b"y" * 100)
    assert lru.get(b"a") is not None  # a is now the most recent
    assert lru.put(b"c", b"z" * 100)
    assert b"b" not in lru and b"a" in lru and lru.size().evictions == 1
    assert not lru.put(b"huge", b"h" * 1000)
    generation = lru.generation
    assert lru.pop(b"a")
    assert not lru.put(b"a", b"x" * 100, generation)  # a delete raced this read-through
    assert lru.size().bytes_used <= 2 * (100 + ENTRY_OVERHEAD)


def test_lru_admits_a_record_on_its_second_read_and_remembers_a_bounded_number() -> None:
    lru = ByteLRU(capacity=MIN_GHOSTS * GHOST_SPAN)  # remembers MIN_GHOSTS keys read once
    assert not lru.admit(b"a") and lru.admit(b"a")  # the second read admits it
    assert not lru.admit(b"a")  # admitted keys are forgotten: a third read starts over
    keys = [b"k%d" % i for i in range(MIN_GHOSTS + 1)]
    assert not any(lru.admit(key) for key in keys)
    assert not lru.admit(keys[0])  # the oldest was forgotten to stay within the bound
    assert all(lru.admit(key) for key in keys[2:])  # the others are remembered
    assert lru.size().entries == 0  # admitting decides; only ``put`` caches


@ON_EVERY_STORE
def test_a_failed_store_delete_raises_and_leaves_both_tiers(
    store, monkeypatch, daemon_backend: str
) -> None:
    client_keys = [page_key(i) for i in range(2)]
    records = [page_record(key, i) for i, key in enumerate(client_keys)]
    keys = [scoped_key("t", key) for key in client_keys]
    s = store()
    assert s.put(keys, records) == [True, True]

    def fail(self: object, keys: object) -> int:
        return 0  # as the backends report a delete whose transaction did not commit

    monkeypatch.setattr(OPENERS[daemon_backend], "delete", fail)
    with pytest.raises(StorageWriteError):  # the daemon answers INTERNAL, not deleted=2
        s.delete(keys)
    monkeypatch.undo()
    assert s.get(keys, client_keys, 1 << 30).records == records
    assert s.delete(keys) == 2


@ON_EVERY_STORE
def test_a_tenant_given_a_quota_later_keeps_reading_its_shared_pages(store) -> None:
    """Pages a tenant wrote into the shared store before it had a quota stay readable
    (GET, EXISTS, CONTAINS), are not written again into its own store (the first page
    wins), are deleted from both stores, and go when the shared store evicts them."""
    client = [page_key(i) for i in range(6)]
    records = [page_record(key, i, size=4096) for i, key in enumerate(client)]
    scoped = [scoped_key("t", key) for key in client]
    before = store(memory_bytes=0)
    assert before.put(scoped[:4], records[:4], "t") == [True] * 4
    before.close()

    later = store(memory_bytes=0, quotas={"t": 8 << 20}, max_bytes=48 << 10)
    assert later.get(scoped, client, 1 << 30, "t").records == [*records[:4], None, None]
    assert later.exists(scoped, "t") == 4
    assert later.contains(scoped[::-1], "t") == [False, False, True, True, True, True]
    again = [page_record(key, 100 + i, size=4096) for i, key in enumerate(client)]
    assert later.put(scoped[2:], again[2:], "t") == [True] * 4  # 2, 3 held: kept as they were
    lookup = later.get(scoped, client, 1 << 30, "t")
    assert lookup.records == [*records[:4], *again[4:]]
    assert later.tenant_size("t") == (2, 2 * (4096 + HEADER_BYTES), 8 << 20, 0)  # one header
    assert later.delete(scoped[1:], "t") == 5  # 1-3 from the shared store, 4-5 its own
    assert later.get(scoped, client, 1 << 30, "t").records == [records[0], *[None] * 5]
    assert later.size().store_entries == 1

    others = [scoped_key("other", page_key(i)) for i in range(12)]
    other_records = [page_record(page_key(i), i, size=4096) for i in range(12)]
    assert later.put(others, other_records, "other") == [True] * 12  # evicts page 0
    assert later.get(scoped[:1], client[:1], 1 << 30, "t").records == [None]
    assert later.exists(scoped[:1], "t") == 0


def test_tenant_stores_live_beside_the_shared_one(tmp_path: Path) -> None:
    assert tenant_store_path(str(tmp_path / "store") + "/", "t") == f"{tmp_path}/store.tenant-t"


@pytest.mark.parametrize(("before", "after"), [("lmdb", "disk"), ("disk", "lmdb")])
def test_a_store_of_the_other_kind_is_opened_as_it_is(
    store, tmp_path: Path, caplog, before: str, after: str
) -> None:
    """``store.backend`` changed over an existing store: its pages stay served (logged),
    never an empty store of the new kind in its place."""
    client = [page_key(i) for i in range(3)]
    records = [page_record(key, i, size=4096) for i, key in enumerate(client)]
    scoped = [scoped_key("t", key) for key in client]
    first = store(memory_bytes=0, backend=before)
    assert first.put(scoped, records) == [True] * 3
    first.close()
    with caplog.at_level(logging.WARNING):
        reopened = store(memory_bytes=0, backend=after)
    assert f"already holds a store of the {before} backend" in caplog.text
    assert reopened.get(scoped, client, 1 << 30).records == records
    assert reopened.put(scoped[:1], [page_record(client[0], 9, size=4096)]) == [True]
    assert detect(tmp_path / "store") == before


class _CountingBuffers:
    """ReplyBuffers that remember what they lent and what came back."""

    def __init__(self) -> None:
        self.lent: list[memoryview] = []
        self.back: list[memoryview] = []

    def take(self, size: int) -> memoryview:
        self.lent.append(memoryview(bytearray(size)))
        return self.lent[-1]

    def give_back(self, buffer: memoryview) -> None:
        self.back.append(buffer)


@ON_EVERY_STORE
def test_store_reads_land_in_the_callers_buffers_and_misses_come_back(
    store, tmp_path: Path, daemon_backend: str
) -> None:
    client = [page_key(i) for i in range(6)]
    records = [page_record(key, i, size=4096) for i, key in enumerate(client)]
    scoped = [scoped_key("t", key) for key in client]
    s = store(memory_bytes=1 << 20)
    assert s.put(scoped[1:5], records[1:5]) == [True] * 4  # not cached in memory
    s.close()
    s = store(memory_bytes=1 << 20)  # memory empty: every hit is a store read
    buffers = _CountingBuffers()
    cap = 3 * len(records[0])  # keys 1-3 fit; 4 would exceed: not read
    lookup = s.get(scoped, client, cap, buffers=buffers)
    assert lookup.records == [None, *records[1:4], None, None] and lookup.truncated
    hits = [r for r in lookup.records if r is not None]
    assert len(buffers.lent) == 3 and all(any(r is b for b in buffers.lent) for r in hits)
    assert buffers.back == []
    # Read again, the hits join the memory tier as copies (bytes), never the caller's
    # reused buffers.
    assert s.cached(scoped[1:4]) is None
    assert s.get(scoped, client, cap, buffers=buffers).records == lookup.records
    cached = s.cached(scoped[1:4])
    assert cached is not None and cached == records[1:4]
    assert all(isinstance(r, bytes) for r in cached)

    # A record written wrapped (by an older daemon) whose client header names another
    # key: read, found wrong, given back. (A record stored the new way has no client
    # header: the writer checked it before its key was rewritten.)
    s.close()
    write_wrapped(tmp_path / "store", daemon_backend, [scoped[0]], [records[5]])
    s = store(memory_bytes=0)
    buffers = _CountingBuffers()
    assert s.get(scoped[:1], client[:1], 1 << 30, buffers=buffers).records == [None]
    assert len(buffers.lent) == 1 and buffers.back[0] is buffers.lent[0]
