"""The disk store's capacity after puts whose segment writes failed (a full disk, an I/O
error, a short write, a segment that cannot grow), on all or some spans of a batch:
the failed pages are reported not stored, every slot the batch took is free again,
and a later put of as many pages as ``max_bytes`` allows stores every one of them.

Faults come in through the calls the store makes (``os.pwritev``, ``os.posix_fallocate``),
patched for the failing put only."""

from __future__ import annotations

import errno
import hashlib
import itertools
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from storage_backends import StorageBackend, StorageConfig, create
from storage_backends.page_format import HEADER_BYTES

SIZE = 4096
PAGES = 16  # what max_bytes holds
Write = Callable[[int, Sequence[bytes | memoryview], int], int]


def _key(tag: str, i: int) -> bytes:
    return hashlib.sha256(f"{tag}-{i}".encode()).digest()


def _payload(tag: str, i: int) -> bytes:
    return (hashlib.sha256(f"bytes-{tag}-{i}".encode()).digest() * (SIZE // 32))[:SIZE]


def _config(path: Path, io_threads: int = 4) -> StorageConfig:
    return StorageConfig(
        backend="disk",
        path=str(path),
        max_bytes=PAGES * (HEADER_BYTES + SIZE),
        sync="none",
        io_threads=io_threads,
    )


def _put(store: StorageBackend, tag: str, ids: Sequence[int]) -> list[bool]:
    keys = [_key(tag, i) for i in ids]
    return store.put(keys, [memoryview(_payload(tag, i)) for i in ids])


def _serves(store: StorageBackend, tag: str, ids: Sequence[int]) -> list[bool]:
    """Hits of ``ids`` (every hit checked bit-exact)."""
    dst = [memoryview(bytearray(SIZE)) for _ in ids]
    hits = store.get([_key(tag, i) for i in ids], dst)
    for i, hit, buf in zip(ids, hits, dst, strict=True):
        assert not hit or bytes(buf) == _payload(tag, i), f"page {tag}-{i}: wrong bytes"
    return hits


def _takes_a_full_store(store: StorageBackend, tag: str) -> None:
    """A put of as many pages as max_bytes allows stores all of them, all readable."""
    assert _put(store, tag, range(PAGES)) == [True] * PAGES
    assert _serves(store, tag, range(PAGES)) == [True] * PAGES
    stats = store.stats()
    assert stats.entries == PAGES and stats.bytes_used == PAGES * (HEADER_BYTES + SIZE)


def _failing(how: str, real: Write, every: int) -> Write:
    """``os.pwritev`` that fails one call in ``every`` (every call when 1): ENOSPC, EIO,
    or a short write (half of the bytes written, as a disk filling up mid-write)."""
    calls = itertools.count()
    lock = threading.Lock()  # the I/O pool writes spans from several threads

    def pwritev(fd: int, bufs: Sequence[bytes | memoryview], offset: int) -> int:
        with lock:
            n = next(calls)
        if n % every:
            return real(fd, bufs, offset)
        if how == "short":
            data = b"".join(bytes(b) for b in bufs)
            return real(fd, [data[: len(data) // 2]], offset)
        code = errno.ENOSPC if how == "enospc" else errno.EIO
        raise OSError(code, os.strerror(code))

    return pwritev


@pytest.fixture
def store(tmp_path: Path):
    opened: list[StorageBackend] = []

    def make(io_threads: int = 4) -> StorageBackend:
        opened.append(create("disk", _config(tmp_path / "s", io_threads)))
        return opened[-1]

    yield make
    for s in opened:
        s.close()


@pytest.mark.parametrize("how", ["enospc", "eio", "short"])
def test_a_batch_whose_every_write_failed_gives_all_its_slots_back(
    store, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    s = store()
    assert _put(s, "warm", range(2)) == [True, True]  # the segment exists already
    assert s.delete([_key("warm", i) for i in range(2)]) == 2
    monkeypatch.setattr(os, "pwritev", _failing(how, os.pwritev, every=1))
    assert _put(s, "lost", range(PAGES)) == [False] * PAGES
    monkeypatch.undo()
    assert s.stats().entries == 0 and s.exists([_key("lost", 0)]) == 0
    _takes_a_full_store(s, "after")


@pytest.mark.parametrize("how", ["enospc", "eio", "short"])
def test_a_batch_with_some_failed_spans_gives_their_slots_back(
    store, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """A full store: the batch evicts for room, some of its spans fail. What was stored
    is served; the slots of the failed spans (and of the pages evicted for them) are
    free: the next full-size put stores every page, twice over."""
    s = store(io_threads=4)
    assert _put(s, "old", range(PAGES)) == [True] * PAGES
    monkeypatch.setattr(os, "pwritev", _failing(how, os.pwritev, every=2))
    results = _put(s, "half", range(PAGES))
    monkeypatch.undo()
    stored = [i for i, ok in enumerate(results) if ok]
    assert 0 < len(stored) < PAGES, results  # several spans, some failed
    assert _serves(s, "half", range(PAGES)) == results
    assert s.stats().put_failures == PAGES - len(stored)
    _takes_a_full_store(s, "again")
    _takes_a_full_store(s, "and-again")


def test_one_page_puts_that_failed_leave_no_slot_behind(
    store, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = store()
    monkeypatch.setattr(os, "pwritev", _failing("enospc", os.pwritev, every=1))
    for i in range(PAGES):
        assert _put(s, "lost", [i]) == [False]
    monkeypatch.undo()
    _takes_a_full_store(s, "after")


def test_a_segment_that_cannot_grow_fails_its_pages_and_keeps_no_slot(
    store, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = store()

    def full(*args: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    monkeypatch.setattr(os, "pwritev", full)
    assert _put(s, "lost", range(PAGES)) == [False] * PAGES
    monkeypatch.undo()
    _takes_a_full_store(s, "after")
