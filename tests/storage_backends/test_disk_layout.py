"""The disk store's layout promises: space per page, scatter reads, durability levels,
O_DIRECT (or a clear error where the file system refuses it), a put on a full disk."""

from __future__ import annotations

import errno
import hashlib
import os
from dataclasses import replace
from pathlib import Path

import pytest

from storage_backends import StorageConfig, StorageOpenError, create
from storage_backends.disk import DiskBackend
from storage_backends.disk.layout import slot_class
from storage_backends.page_format import HEADER_BYTES


def _key(i: int) -> bytes:
    return hashlib.sha256(f"layout-{i}".encode()).digest()


def _payload(i: int, size: int) -> bytes:
    return hashlib.sha256(f"bytes-{i}".encode()).digest() * (size // 32)


@pytest.mark.parametrize(
    ("size", "bound"), [(4096, 1.1), (16 << 10, 1.05), (64 << 10, 1.05), (1 << 20, 1.05)]
)
def test_space_per_page(size: int, bound: float) -> None:
    assert slot_class(size, direct_io=False).stride <= size * bound
    assert slot_class(size, direct_io=True).stride % 4096 == 0


def test_segment_files_grow_close_to_their_records(tmp_path: Path) -> None:
    """A store a quarter full: its file holds at most 1 MiB or 1/64 more than its
    records. Growth by doubling made 4,100 pages of 4 KiB (17 MB) a 32 MiB file."""
    pages, size = 4100, 4096
    path = tmp_path / "s"
    config = StorageConfig(
        backend="disk", path=str(path), max_bytes=4 * pages * (size + HEADER_BYTES), sync="none"
    )
    store = create("disk", config)
    try:
        for at in range(0, pages, 128):
            ids = range(at, min(at + 128, pages))
            assert all(store.put([_key(i) for i in ids], [memoryview(bytes(size))] * len(ids)))
        used = pages * slot_class(size, direct_io=False).stride
    finally:
        store.close()
    files = sum(f.stat().st_size for f in path.glob("segment-*"))
    assert used <= files <= used + max(1 << 20, used // 64) + (1 << 20)


@pytest.mark.parametrize("size", [4096, 16 << 10])
def test_a_store_holds_what_its_capacity_says(tmp_path: Path, size: int) -> None:
    """Pages of one size fill ``max_bytes`` to within one slot's overhead per page."""
    pages = 40
    config = StorageConfig(
        backend="disk",
        path=str(tmp_path / "s"),
        max_bytes=pages * (size + HEADER_BYTES),
        sync="none",
    )
    store = create("disk", config)
    try:
        ids = range(2 * pages)
        store.put([_key(i) for i in ids], [memoryview(_payload(i, size)) for i in ids])
        assert store.stats().entries == pages
        assert store.stats().bytes_used <= config.max_bytes
    finally:
        store.close()


def test_scatter_read_fills_runs_in_order(tmp_path: Path) -> None:
    store = DiskBackend(StorageConfig(backend="disk", path=str(tmp_path / "s"), sync="none"))
    try:
        size = 12288
        assert store.put([_key(1)], [memoryview(_payload(1, size))]) == [True]
        runs = [memoryview(bytearray(n)) for n in (4096, 100, size - 4196)]
        wrong = [memoryview(bytearray(4096)), memoryview(bytearray(4096))]
        assert store.get_scatter([_key(1), _key(1), _key(2)], [runs, wrong, runs[:1]]) == [
            True,
            False,
            False,
        ]
        assert b"".join(bytes(run) for run in runs) == _payload(1, size)
    finally:
        store.close()


@pytest.mark.parametrize("sync", ["none", "index", "full", True, False])
def test_every_durability_level_stores_and_reopens(tmp_path: Path, sync: str | bool) -> None:
    config = StorageConfig(backend="disk", path=str(tmp_path / "s"), sync=sync)
    store = create("disk", config)
    assert store.put([_key(0)], [memoryview(_payload(0, 4096))]) == [True]
    store.close()
    store = create("disk", config)
    try:
        dst = memoryview(bytearray(4096))
        assert store.get([_key(0)], [dst]) == [True] and bytes(dst) == _payload(0, 4096)
    finally:
        store.close()


def test_an_unknown_durability_level_is_refused() -> None:
    with pytest.raises(ValueError, match=r"storage\.sync"):
        StorageConfig(backend="disk", sync="sometimes")


def test_direct_io_round_trips_or_is_refused_clearly(tmp_path: Path) -> None:
    config = StorageConfig(backend="disk", path=str(tmp_path / "s"), direct_io=True, sync="none")
    try:
        store = create("disk", config)
    except StorageOpenError as exc:
        assert "direct_io" in str(exc)
        return
    try:
        ids = range(3)
        sizes = [4096, 4992, 64 << 10]
        src = [memoryview(_payload(i, n)) for i, n in zip(ids, sizes, strict=True)]
        assert store.put([_key(i) for i in ids], src) == [True] * 3
        dst = [memoryview(bytearray(n)) for n in sizes]
        assert store.get([_key(i) for i in ids], dst) == [True] * 3
        assert [bytes(d) for d in dst] == [bytes(s) for s in src]
    finally:
        store.close()


def test_a_full_disk_is_a_failed_put(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = create("disk", StorageConfig(backend="disk", path=str(tmp_path / "s"), sync="none"))
    try:

        def full(*args: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "posix_fallocate", full)
        monkeypatch.setattr(os, "pwritev", full)
        assert store.put([_key(0)], [memoryview(_payload(0, 4096))]) == [False]
        assert store.stats().put_failures == 1
        monkeypatch.undo()
        assert store.put([_key(0)], [memoryview(_payload(0, 4096))]) == [True]
        assert store.stats().entries == 1
    finally:
        store.close()


def test_direct_io_refused_by_the_file_system_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def no_direct(path: str, flags: int, mode: int = 0o777) -> int:
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", no_direct)
    config = StorageConfig(backend="disk", path=str(tmp_path / "s"), direct_io=True)
    with pytest.raises(StorageOpenError, match="direct_io"):
        create("disk", config)
    monkeypatch.undo()
    store = create("disk", StorageConfig(backend="disk", path=str(tmp_path / "s")))
    store.close()  # the refused open left the store usable


def test_direct_io_reads_a_store_written_without_it(tmp_path: Path) -> None:
    """Records packed at 64-byte offsets (written without O_DIRECT) stay readable one
    by one after the store is reopened with ``direct_io``: an offset the kernel will
    not take is read from the block below it, never taken for a damaged page."""
    config = StorageConfig(backend="disk", path=str(tmp_path / "s"), sync="none")
    store = create("disk", config)
    assert store.put([_key(i) for i in range(3)], [memoryview(_payload(i, 4096)) for i in range(3)])
    store.close()
    try:
        store = create("disk", replace(config, direct_io=True))
    except StorageOpenError:
        pytest.skip("this file system refuses O_DIRECT")
    try:
        for i in (2, 1, 0):  # one page a get: each read starts at its own record
            dst = memoryview(bytearray(4096))
            assert store.get([_key(i)], [dst]) == [True] and bytes(dst) == _payload(i, 4096)
        assert (store.stats().entries, store.stats().corrupt) == (3, 0)
    finally:
        store.close()
