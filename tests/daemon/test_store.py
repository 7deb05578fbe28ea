"""DaemonStore and ByteLRU in process: tenant scoping, bounds, read-through, damage, races."""

from __future__ import annotations

from pathlib import Path

import pytest

from hicache.config.daemon import StoreConfig
from hicache.daemon.memory_lru import ENTRY_OVERHEAD, ByteLRU
from hicache.daemon.store import DaemonStore, scoped_key
from storage_backends.errors import StorageWriteError
from storage_backends.lmdb_backend import LmdbBackend

from .conftest import page_key, page_record


@pytest.fixture
def store(tmp_path: Path):
    opened: list[DaemonStore] = []

    def make(memory_bytes: int = 1 << 20) -> DaemonStore:
        config = StoreConfig(
            path=str(tmp_path / "store"), max_bytes=16 << 20, memory_bytes=memory_bytes
        )
        opened.append(DaemonStore(config, max_page_bytes=1 << 20))
        return opened[-1]

    yield make
    for s in opened:
        s.close()


def test_scoped_keys_separate_tenants() -> None:
    key = page_key(0)
    assert scoped_key("a", key) != scoped_key("b", key)
    assert len(scoped_key("a", key)) == 32


def test_store_reads_through_memory_and_survives_reopen(store) -> None:
    client_keys = [page_key(i) for i in range(8)]
    records = [page_record(key, i, size=4096) for i, key in enumerate(client_keys)]
    keys = [scoped_key("t", key) for key in client_keys]
    s = store(memory_bytes=3 * (4096 + 56 + ENTRY_OVERHEAD))  # room for three pages
    assert s.put(keys, records) == [True] * 8
    size = s.size()
    assert size.memory_entries == 3 and size.memory_evictions == 5 and size.store_entries == 8
    lookup = s.get(keys, client_keys, 1 << 30)
    assert [bytes(r) for r in lookup.records if r is not None] == records
    assert (lookup.memory_hits, lookup.store_hits) == (3, 5)
    assert s.exists(keys) == 8
    assert s.delete([keys[0], keys[0], scoped_key("t", b"none")]) == 1
    assert s.exists(keys) == 0
    capped = s.get(keys[1:], client_keys[1:], max_bytes=2 * len(records[0]) + 10)
    assert capped.records == [*records[1:3], *[None] * 5]  # later keys: misses, not read
    s.close()
    reopened = store()
    assert reopened.get(keys[1:], client_keys[1:], 1 << 30).records == records[1:]


def test_damaged_stored_page_is_a_miss_and_counted(store, tmp_path: Path) -> None:
    client_key = page_key(1)
    record = page_record(client_key, 7, size=4096)
    s = store()
    assert s.put([scoped_key("t", client_key)], [record]) == [True]
    s.close()
    data = tmp_path / "store" / "data.mdb"
    raw = bytearray(data.read_bytes())
    at = raw.find(record[-64:])
    assert at > 0
    raw[at] ^= 0xFF
    data.write_bytes(bytes(raw))
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


def test_a_failed_lmdb_delete_raises_and_leaves_both_tiers(store, monkeypatch) -> None:
    client_keys = [page_key(i) for i in range(2)]
    records = [page_record(key, i) for i, key in enumerate(client_keys)]
    keys = [scoped_key("t", key) for key in client_keys]
    s = store()
    assert s.put(keys, records) == [True, True]

    def fail(self: LmdbBackend, keys: object) -> int:
        raise StorageWriteError("injected: the transaction did not commit")

    monkeypatch.setattr(LmdbBackend, "remove", fail)
    with pytest.raises(StorageWriteError):  # the daemon answers INTERNAL, not deleted=2
        s.delete(keys)
    monkeypatch.undo()
    assert s.get(keys, client_keys, 1 << 30).records == records
    assert s.delete(keys) == 2
