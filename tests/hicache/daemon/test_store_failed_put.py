"""The daemon's memory tier when its ``disk`` page store fails to commit a PUT (a full
disk, an I/O error): the PUT is answered not stored, and no later GET, EXISTS or
CONTAINS sees the record, neither from the memory tier (the socket thread's answer
included) nor from the store. Once the disk works again, the same PUT stores.

The store is named (``disk``): faults come in through the ``os.pwritev`` its segment
writes use, patched while the failing PUT runs."""

from __future__ import annotations

import errno
import itertools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from hicache.config.daemon import DaemonConfig, StoreConfig
from hicache.daemon.store import DaemonStore, scoped_key
from storage_backends.remote.protocol import ContainsReply, ExistsReply, Op

from .conftest import Client, in_process_daemon, page_key, page_record

SIZE = 4096
N = 16
Write = Callable[[int, Sequence[bytes | memoryview], int], int]


def failing_pwritev(every: int = 1) -> Write:
    """``os.pwritev`` whose every ``every``-th call (from the first) fails with ENOSPC;
    the others write. Thread-safe (the store writes spans on its I/O pool)."""
    real, calls, lock = os.pwritev, itertools.count(), threading.Lock()

    def pwritev(fd: int, bufs: Sequence[bytes | memoryview], offset: int) -> int:
        with lock:
            n = next(calls)
        if n % every == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, bufs, offset)

    return pwritev


def records(tag: str, n: int = N) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """(client keys, scoped keys, records) of ``n`` pages."""
    client = [page_key(i, tag) for i in range(n)]
    return (
        client,
        [scoped_key("t", key) for key in client],
        [page_record(key, i, SIZE) for i, key in enumerate(client)],
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[DaemonStore]:
    config = StoreConfig(
        backend="disk", path=str(tmp_path / "store"), max_bytes=16 << 20, memory_bytes=4 << 20
    )
    made = DaemonStore(config, max_page_bytes=1 << 20)
    yield made
    made.close()


def assert_unseen(s: DaemonStore, scoped: list[bytes], client: list[bytes]) -> None:
    """No read of ``scoped`` finds any of them, from memory or the store."""
    assert s.cached(scoped[:1]) is None and not s.all_cached(scoped[:1])
    assert s.exists(scoped) == 0
    assert s.contains(scoped) == [False] * len(scoped)
    lookup = s.get(scoped, client, 1 << 30)
    assert lookup.records == [None] * len(scoped)
    assert (lookup.memory_hits, lookup.store_hits) == (0, 0)


def test_a_put_the_store_did_not_commit_is_not_cached(
    store: DaemonStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, scoped, recs = records("lost")
    monkeypatch.setattr(os, "pwritev", failing_pwritev())
    assert store.put(scoped, recs) == [False] * N
    assert_unseen(store, scoped, client)
    monkeypatch.undo()
    assert_unseen(store, scoped, client)
    size = store.size()
    assert (size.memory_entries, size.store_entries, size.store_put_failures) == (0, 0, N)
    assert store.put(scoped, recs) == [True] * N  # the disk works again: stored now
    assert [bytes(r) for r in store.get(scoped, client, 1 << 30).records if r] == recs


def test_of_a_put_partly_committed_only_what_was_stored_is_seen(
    store: DaemonStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, scoped, recs = records("half")
    monkeypatch.setattr(os, "pwritev", failing_pwritev(every=2))
    stored = store.put(scoped, recs)
    monkeypatch.undo()
    assert 0 < sum(stored) < N, stored  # several spans, some failed
    lost = [i for i, ok in enumerate(stored) if not ok]
    assert_unseen(store, [scoped[i] for i in lost], [client[i] for i in lost])
    lookup = store.get(scoped, client, 1 << 30)
    assert [r is not None for r in lookup.records] == stored
    assert all(bytes(r) == recs[i] for i, r in enumerate(lookup.records) if r is not None)
    assert lookup.memory_hits == sum(stored)  # the stored ones were cached on the way


def test_the_daemon_answers_not_stored_and_serves_nothing_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the wire: a daemon in this process on a disk store whose writes fail."""
    config = DaemonConfig().with_overrides(
        server={"endpoint": "tcp://127.0.0.1:0"},
        store={
            "backend": "disk",
            "path": str(tmp_path / "store"),
            "max_bytes": 16 << 20,
            "memory_bytes": 4 << 20,
        },
    )
    keys = [page_key(i, "wire") for i in range(N)]
    recs = [page_record(key, i, SIZE) for i, key in enumerate(keys)]
    with in_process_daemon(config) as served:
        client = Client(served.endpoint)
        try:
            monkeypatch.setattr(os, "pwritev", failing_pwritev())
            assert client.put(keys, recs) == (False,) * N
            monkeypatch.undo()
            for _ in range(2):  # the second GET would come from the memory tier
                assert client.get(keys) == [None] * N
            exists = client.call(Op.EXISTS, keys)
            assert isinstance(exists, ExistsReply) and exists.count == 0
            contains = client.call(Op.CONTAINS, keys)
            assert isinstance(contains, ContainsReply) and not any(contains.present)
            assert client.put(keys, recs) == (True,) * N
            assert client.get(keys) == recs
        finally:
            client.close()
