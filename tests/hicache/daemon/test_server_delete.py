"""An acked DELETE holds while other clients read the same keys; a re-PUT serves new bytes;
a read-through a DELETE overtook leaves nothing cached."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from hicache.config.daemon import DaemonConfig
from hicache.daemon.record_store import OPENERS
from storage_backends.remote.protocol import DeleteReply, Op, Request, encode_request

from .conftest import (
    ON_EVERY_STORE,
    REPLY_TIMEOUT_S,
    Client,
    daemon_toml,
    in_process_daemon,
    page_key,
    page_record,
)

ROUNDS = 40
KEYS = [page_key(i, "del-") for i in range(8)]


def _read_forever(endpoint: str, stop: threading.Event, errors: list[str]) -> None:
    client = Client(endpoint)
    try:
        while not stop.is_set():
            if client.call(Op.GET, KEYS) is None:
                errors.append("a reader got no reply")
                return
    finally:
        client.close()


@ON_EVERY_STORE
def test_acked_delete_is_honoured_under_concurrent_reads(
    start_daemon, connect, tmp_path, daemon_backend: str
) -> None:
    # A tiny memory tier: GETs keep reading through from the store while the writer deletes.
    config = daemon_toml(
        tmp_path / "store", memory_bytes=1 << 20, sync=False, backend=daemon_backend
    )
    daemon = start_daemon(config)
    writer = connect(daemon.endpoint)
    daemon.wait_ping(writer)
    stop, errors = threading.Event(), []
    readers = [
        threading.Thread(target=_read_forever, args=(daemon.endpoint, stop, errors))
        for _ in range(2)
    ]
    for reader in readers:
        reader.start()
    served_after_delete = stale_after_reput = 0
    try:
        for round_ in range(ROUNDS):
            old = [page_record(key, 2 * round_, 4096) for key in KEYS]
            new = [page_record(key, 2 * round_ + 1, 4096) for key in KEYS]
            assert writer.put(KEYS, old) == (True,) * len(KEYS)
            deleted = writer.call(Op.DELETE, KEYS)
            assert isinstance(deleted, DeleteReply) and deleted.deleted == len(KEYS), deleted
            served_after_delete += sum(page is not None for page in writer.get(KEYS))
            assert writer.put(KEYS, new) == (True,) * len(KEYS)
            stale_after_reput += sum(
                page != rec for page, rec in zip(writer.get(KEYS), new, strict=True)
            )
            assert writer.call(Op.DELETE, KEYS) is not None
    finally:
        stop.set()
        for reader in readers:
            reader.join()
    assert not errors, errors
    assert served_after_delete == 0, f"{served_after_delete} deleted pages served"
    assert stale_after_reput == 0, f"{stale_after_reput} stale pages served after a re-PUT"


@pytest.mark.parametrize("backend", sorted(OPENERS))
def test_a_read_through_that_a_delete_overtook_caches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """A GET has read the page from the store when a DELETE of it commits and is acked;
    the GET's reply may still carry the page (it began first), but the memory tier must
    not keep it: the next GET is a miss."""
    key = page_key(0, "overtaken-")
    read, gate = threading.Event(), threading.Event()
    store_class = OPENERS[backend]
    original = store_class.get_records

    def get_records(self: object, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        hits = original(self, keys, dst)
        if not gate.is_set() and any(hits):  # the page is read: hold before it is cached
            read.set()
            assert gate.wait(REPLY_TIMEOUT_S)
        return hits

    monkeypatch.setattr(store_class, "get_records", get_records)
    config = DaemonConfig().with_overrides(
        server={"endpoint": "tcp://127.0.0.1:0"},
        store={"backend": backend, "path": str(tmp_path / "store"), "memory_bytes": 64 << 10},
    )
    with in_process_daemon(config) as served:
        reader, writer = Client(served.endpoint), Client(served.endpoint)
        try:
            record = page_record(key, 0, 4096)
            assert writer.put([key], [record]) == (True,)
            fillers = [page_key(i, "filler-") for i in range(24)]  # push it out of memory
            assert all(writer.put(fillers, [page_record(k, 1, 4096) for k in fillers]))
            reader.sock.send_multipart(encode_request(Request(Op.GET, 1, (key,))))
            assert read.wait(REPLY_TIMEOUT_S)
            assert writer.call(Op.DELETE, [key]) == DeleteReply(writer._next_id, 1)
            gate.set()
            assert reader.recv() is not None  # the overtaken GET is answered
            assert writer.get([key]) == [None]
        finally:
            gate.set()
            reader.close()
            writer.close()
