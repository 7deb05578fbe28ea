"""Records stored once (the header's key rewritten to the scoped key), and stores written
the old way (each client record wrapped whole in a store page) read the new way: an
upgraded daemon serves its old pages, mixed with new ones, and never another tenant's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import xxhash

from hicache.config.daemon import StoreConfig
from hicache.daemon.auth import DEFAULT_TENANT
from hicache.daemon.record_store import OPENERS
from hicache.daemon.store import DaemonStore, scoped_key
from storage_backends import StorageConfig
from storage_backends.page_format import HEADER_BYTES, MAGIC, encode_page
from storage_backends.remote.protocol import Op

from .conftest import ON_EVERY_STORE, page_key, page_record, write_wrapped

pytestmark = ON_EVERY_STORE
SIZE = 4096


@pytest.fixture
def open_store(tmp_path: Path, daemon_backend: str) -> Iterator:
    opened: list[DaemonStore] = []

    def make(memory_bytes: int = 0, quotas: dict[str, int] | None = None) -> DaemonStore:
        config = StoreConfig(
            backend=daemon_backend,
            path=str(tmp_path / "store"),
            max_bytes=16 << 20,
            memory_bytes=memory_bytes,
        )
        opened.append(DaemonStore(config, max_page_bytes=1 << 20, quotas=quotas))
        return opened[-1]

    yield make
    for store in opened:
        store.close()


def _plain(tmp_path: Path, backend: str) -> object:
    """The daemon's store opened as a plain backend (to look at what is stored)."""
    config = StorageConfig(
        backend=backend, path=str(tmp_path / "store"), max_bytes=16 << 20, max_page_bytes=1 << 20
    )
    return OPENERS[backend](config)


def test_a_put_stores_the_record_once_under_the_scoped_key(
    open_store, tmp_path: Path, daemon_backend: str, monkeypatch
) -> None:
    client = [page_key(i) for i in range(3)]
    records = [page_record(key, i, size=SIZE) for i, key in enumerate(client)]
    scoped = [scoped_key("t", key) for key in client]
    store = open_store()
    hashed: list[int] = []
    real = xxhash.xxh3_64_intdigest
    monkeypatch.setattr(xxhash, "xxh3_64_intdigest", lambda data: hashed.append(1) or real(data))
    assert store.put(scoped, records, "t") == [True] * 3
    assert hashed == []  # the writer verified the records: the store hashes nothing again
    monkeypatch.undo()
    assert store.size().store_bytes == 3 * (SIZE + HEADER_BYTES)
    store.close()
    plain = _plain(tmp_path, daemon_backend)
    try:  # a page of the backend like any other: its payload is the client's payload
        dst = [memoryview(bytearray(SIZE)) for _ in scoped]
        assert plain.get(scoped, dst) == [True] * 3  # type: ignore[attr-defined]
        assert [bytes(d) for d in dst] == [r[HEADER_BYTES:] for r in records]
    finally:
        plain.close()  # type: ignore[attr-defined]
    store = open_store()
    assert store.get(scoped, client, 1 << 30, "t").records == records


def test_a_store_written_wrapped_is_read_mixed_with_new_records(
    open_store, tmp_path: Path, daemon_backend: str
) -> None:
    client = [page_key(i) for i in range(6)]
    records = [page_record(key, i, size=SIZE) for i, key in enumerate(client)]
    scoped = [scoped_key("t", key) for key in client]
    assert write_wrapped(tmp_path / "store", daemon_backend, scoped[:3], records[:3]) == [True] * 3
    store = open_store(memory_bytes=1 << 20)
    assert store.exists(scoped, "t") == 3
    assert (
        store.put(scoped[2:], [page_record(k, 99, size=SIZE) for k in client[2:]], "t")
        == [True] * 4
    )  # page 2 is held (wrapped): kept, the first page wins
    assert store.put(scoped[3:], records[3:], "t") == [True] * 3  # held by now: kept
    store.close()

    store = open_store(memory_bytes=1 << 20)  # memory empty: every hit read from the store
    again = [page_record(k, 99, size=SIZE) for k in client[3:]]
    want = [*records[:3], *again]
    for _ in range(2):  # the second read caches them
        lookup = store.get(scoped, client, 1 << 30, "t")
        assert [bytes(r) if r is not None else None for r in lookup.records] == want
        assert lookup.store_hits == 6
    # The memory tier holds what a GET sends: the records framed for the client.
    cached = store.cached(scoped)
    assert cached is not None and [bytes(r) for r in cached] == want
    assert store.get(scoped, client, 1 << 30, "t").memory_hits == 6
    assert store.delete(scoped[1:], "t") == 5  # wrapped and new pages alike
    store.close()
    store = open_store()
    assert store.contains(scoped, "t") == [True] + [False] * 5
    assert store.get(scoped[:1], client[:1], 1 << 30, "t").records == records[:1]


def test_a_wrapped_record_of_another_length_is_a_miss(
    open_store, tmp_path: Path, daemon_backend: str
) -> None:
    key = page_key(1)
    record = bytearray(page_record(key, 1, size=SIZE))
    record[HEADER_BYTES - 16] ^= 0x01  # the client header's length field: not the bytes
    write_wrapped(tmp_path / "store", daemon_backend, [scoped_key("t", key)], [bytes(record)])
    store = open_store()
    assert store.get([scoped_key("t", key)], [key], 1 << 30, "t").records == [None]


def test_a_new_record_whose_payload_starts_like_a_header_is_never_misframed(
    open_store,
) -> None:
    """A payload opening with the magic and version, not a matching header: a miss (the
    rule that tells wrapped records apart refuses it), never bytes framed wrongly."""
    key = page_key(2)
    looks_wrapped = encode_page(key, MAGIC + b"\x01\x00" + bytes(SIZE))
    store = open_store()
    assert store.put([scoped_key("t", key)], [looks_wrapped], "t") == [True]
    assert store.get([scoped_key("t", key)], [key], 1 << 30, "t").records == [None]
    plain = encode_page(key, b"\x00" * 6 + bytes(SIZE))  # same length, ordinary bytes
    other = page_key(3)
    plain_other = encode_page(other, plain[HEADER_BYTES:])
    assert store.put([scoped_key("t", other)], [plain_other], "t") == [True]
    assert store.get([scoped_key("t", other)], [other], 1 << 30, "t").records == [plain_other]


def test_no_tenant_reads_another_tenants_page_new_or_wrapped(
    open_store, tmp_path: Path, daemon_backend: str
) -> None:
    key = page_key(7)
    wrapped_key = page_key(8)
    write_wrapped(
        tmp_path / "store",
        daemon_backend,
        [scoped_key("a", wrapped_key)],
        [page_record(wrapped_key, 8, size=SIZE)],
    )
    store = open_store(quotas={"q": 8 << 20})
    assert store.put([scoped_key("a", key)], [page_record(key, 7, size=SIZE)], "a") == [True]
    for tenant in ("b", "q"):
        asked = [scoped_key(tenant, key), scoped_key(tenant, wrapped_key)]
        lookup = store.get(asked, [key, wrapped_key], 1 << 30, tenant)
        assert lookup.records == [None, None]
        assert store.contains(asked, tenant) == [False, False]
    # The scoped key decides what is read; the client key only frames it: a lookup that
    # paired a's scoped key with b's name for the page would still only ever give a's page.
    mine = store.get([scoped_key("a", key)], [key], 1 << 30, "a").records
    assert mine == [page_record(key, 7, size=SIZE)]


def test_a_daemon_serves_a_store_written_wrapped(
    start_daemon, connect, tmp_path: Path, daemon_backend: str
) -> None:
    client = [page_key(i, "served") for i in range(4)]
    records = [page_record(key, i, size=SIZE) for i, key in enumerate(client)]
    scoped = [scoped_key(DEFAULT_TENANT, key) for key in client]
    write_wrapped(tmp_path / "store", daemon_backend, scoped[:2], records[:2], max_bytes=64 << 20)
    daemon = start_daemon()
    conn = connect(daemon.endpoint)
    daemon.wait_ping(conn)
    assert conn.put(client[2:], records[2:]) == (True, True)
    assert conn.get(client) == records
    reply = conn.call(Op.EXISTS, client)
    assert reply is not None and reply.count == 4  # type: ignore[union-attr]
