"""Capacity: LRU eviction at max_bytes, and a store that really is full."""

from __future__ import annotations

import errno
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from storage_backends import StorageBackend
from storage_backends.file import backend as file_backend_module
from storage_backends.page_format import HEADER_BYTES

if TYPE_CHECKING:
    from conftest import MakeBackend, Pages

SIZE = 4096
STORED = SIZE + HEADER_BYTES


def test_lru_eviction_keeps_recently_read_pages(
    backend_name: str, tmp_path: Path, pages: Pages, make_backend: MakeBackend
) -> None:
    store = make_backend(pages.config(backend_name, tmp_path, max_bytes=4 * STORED))
    keys = pages.keys(range(6))
    for i in range(4):
        assert store.put(keys[i : i + 1], pages.payloads([i], SIZE)) == [True]
    assert store.get(keys[:1], pages.buffers(1, SIZE)) == [True]
    assert store.put(keys[4:6], pages.payloads([4, 5], SIZE)) == [True, True]
    present = [store.exists([key]) == 1 for key in keys]
    assert present == [True, False, False, True, True, True]
    stats = store.stats()
    assert (stats.entries, stats.bytes_used, stats.evictions) == (4, 4 * STORED, 2)


def test_one_batch_larger_than_capacity_never_fails(
    backend_name: str, tmp_path: Path, pages: Pages, make_backend: MakeBackend
) -> None:
    store = make_backend(pages.config(backend_name, tmp_path, max_bytes=3 * STORED))
    assert store.put(pages.keys(range(10)), pages.payloads(range(10), SIZE)) == [True] * 10
    stats = store.stats()
    assert stats.entries == 3
    assert stats.bytes_used <= 3 * STORED
    assert store.exists(pages.keys(range(7, 10))) == 3


def test_page_larger_than_capacity_is_rejected(
    backend_name: str, tmp_path: Path, pages: Pages, make_backend: MakeBackend
) -> None:
    store = make_backend(pages.config(backend_name, tmp_path, max_bytes=SIZE))
    assert store.put(pages.keys(range(1)), pages.payloads([0], SIZE)) == [False]
    assert store.stats().put_failures == 1


@pytest.mark.parametrize("name", ["lmdb", "file"])
def test_capacity_survives_reopen(
    tmp_path: Path, pages: Pages, make_backend: MakeBackend, name: str
) -> None:
    config = pages.config(name, tmp_path, max_bytes=4 * STORED)
    first = make_backend(config)
    first.put(pages.keys(range(4)), pages.payloads(range(4), SIZE))
    first.close()
    second = make_backend(config)
    assert second.stats().bytes_used == 4 * STORED
    second.put(pages.keys(range(4, 6)), pages.payloads(range(4, 6), SIZE))
    assert second.stats().entries == 4
    assert second.exists(pages.keys(range(2, 6))) == 4


def test_lmdb_map_full_fails_puts_but_keeps_serving(
    tmp_path: Path, pages: Pages, make_backend: MakeBackend
) -> None:
    config = replace(pages.config("lmdb", tmp_path, max_bytes=1 << 30), map_size=1 << 20)
    store = make_backend(config)
    size = 64 << 10
    results = store.put(pages.keys(range(32)), pages.payloads(range(32), size))
    stored = results.count(True)
    assert 0 < stored < 32
    assert results == [True] * stored + [False] * (32 - stored)
    assert store.stats().put_failures == 32 - stored
    assert store.put(pages.keys(range(100, 104)), pages.payloads(range(4), size)) == [False] * 4
    _assert_serves(store, pages, stored, size)


def test_file_disk_full_fails_put_cleanly(
    tmp_path: Path, pages: Pages, make_backend: MakeBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = pages.config("file", tmp_path)
    store = make_backend(config)
    assert store.put(pages.keys(range(2)), pages.payloads(range(2), SIZE)) == [True, True]

    def disk_full(fd: int, parts: list[memoryview]) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(file_backend_module, "_write_all", disk_full)
    assert store.put(pages.keys(range(2, 4)), pages.payloads(range(2, 4), SIZE)) == [False] * 2
    stats = store.stats()
    assert (stats.put_failures, stats.entries) == (2, 2)
    leftovers = [p for p in Path(config.path).rglob("*") if p.is_file() and ".tmp" in p.name]
    assert leftovers == []
    assert store.exists(pages.keys(range(4))) == 2
    _assert_serves(store, pages, 2, SIZE)
    monkeypatch.undo()
    assert store.put(pages.keys(range(2, 4)), pages.payloads(range(2, 4), SIZE)) == [True] * 2


def _assert_serves(store: StorageBackend, pages: Pages, count: int, size: int) -> None:
    dst = pages.buffers(count, size)
    assert store.get(pages.keys(range(count)), dst) == [True] * count
    assert [bytes(d) for d in dst] == [pages.payload(i, size) for i in range(count)]
