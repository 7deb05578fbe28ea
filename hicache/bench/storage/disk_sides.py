"""The stores ``bench storage --backend disk`` compares, on the same disk in the same run.

Each side stores the same pages batch by batch and reads them back into the
same buffers: the ``disk`` backend (with its I/O pool of the cell's size), raw
``os.pwrite``/``os.preadv`` of the bare payloads into one preallocated file with
as many threads (the limit: no header, no index, no checksum), the ``lmdb``
backend, and one file per page written then renamed and read with ``readinto``
(SGLang's ``HiCacheFile``, vLLM's ``fs`` tier). ``close``/``reopen`` let the
bench drop the files from the page cache (a mapped file cannot be dropped).
"""

from __future__ import annotations

import dataclasses
import hashlib
import mmap
import os
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple, Protocol

import xxhash

from storage_backends import StorageBackend, StorageConfig, create

SIDES = ("disk", "raw", "lmdb", "file-per-page")


class Pages(NamedTuple):
    """The pages of one cell: keys, sources, destinations (views of one buffer each)."""

    keys: list[bytes]
    src: list[memoryview]
    dst: list[memoryview]
    digests: list[int]

    @property
    def page_bytes(self) -> int:
        return len(self.src[0])

    @property
    def total_bytes(self) -> int:
        return self.page_bytes * len(self.src)


def make_pages(page_bytes: int, count: int) -> Pages:
    """Pages in page-aligned buffers, as engines hand them over (host pools, pinned
    tensors): the copy into and out of the page cache runs at a speed that depends on
    how source and destination line up within 4 KiB (a bytes object's data starts 32
    bytes into its page, which favours some layouts and not others)."""
    source = _aligned(page_bytes * count)
    source[:] = os.urandom(page_bytes * count)
    target = _aligned(page_bytes * count)
    spans = [slice(i * page_bytes, (i + 1) * page_bytes) for i in range(count)]
    keys = [hashlib.sha256(f"disk-bench-{page_bytes}-{i}".encode()).digest() for i in range(count)]
    src = [source[s] for s in spans]
    return Pages(keys, src, [target[s] for s in spans], [xxhash.xxh3_64_intdigest(v) for v in src])


def _aligned(size: int) -> memoryview:
    return memoryview(mmap.mmap(-1, size))


class Side(Protocol):
    """One way of storing the cell's pages in its own directory ``root``."""

    name: str
    root: Path

    def put(self, span: slice) -> None: ...
    def get(self, span: slice) -> None: ...
    def close(self) -> None: ...
    def reopen(self) -> None: ...


class BackendSide:
    """A hicache backend (``disk`` or ``lmdb``), unsynced like every side here."""

    def __init__(self, name: str, root: Path, pages: Pages, threads: int) -> None:
        self.name, self.root, self._pages = name, root, pages
        room = 2 * pages.total_bytes + (64 << 20)
        base = StorageConfig(backend=name, path=str(root), max_bytes=room, sync=False)
        self._config = _with_threads(base, threads) if name == "disk" else base
        self._store: StorageBackend = create(name, self._config)

    def put(self, span: slice) -> None:
        ok = self._store.put(self._pages.keys[span], self._pages.src[span])
        if not all(ok):
            raise RuntimeError(f"{self.name}: put failed for {ok.count(False)} pages")

    def get(self, span: slice) -> None:
        hits = self._store.get(self._pages.keys[span], self._pages.dst[span])
        if not all(hits):
            raise RuntimeError(f"{self.name}: get missed {hits.count(False)} pages")

    def close(self) -> None:
        self._store.close()

    def reopen(self) -> None:
        self._store = create(self.name, self._config)


def _with_threads(config: StorageConfig, threads: int) -> StorageConfig:
    return dataclasses.replace(config, io_threads=threads)


class RawSide:
    """Bare payloads at ``i * page_bytes`` in one preallocated file, ``threads`` at a time."""

    name = "raw"

    def __init__(self, root: Path, pages: Pages, threads: int) -> None:
        self.root, self._pages = root, pages
        root.mkdir()
        self._path = root / "raw.dat"
        self._threads = threads
        self._pool = ThreadPoolExecutor(threads) if threads > 1 else None
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        os.posix_fallocate(self._fd, 0, pages.total_bytes)

    def _each(self, span: slice, one: Callable[[int], None]) -> None:
        indices = range(*span.indices(len(self._pages.src)))
        if self._pool is None:
            for i in indices:
                one(i)
        else:
            list(self._pool.map(one, indices))

    def _write(self, i: int) -> None:
        os.pwrite(self._fd, self._pages.src[i], i * self._pages.page_bytes)

    def _read(self, i: int) -> None:
        os.preadv(self._fd, [self._pages.dst[i]], i * self._pages.page_bytes)

    def put(self, span: slice) -> None:
        self._each(span, self._write)

    def get(self, span: slice) -> None:
        self._each(span, self._read)

    def close(self) -> None:
        os.close(self._fd)
        if self._pool is not None:
            self._pool.shutdown()

    def reopen(self) -> None:
        self._fd = os.open(self._path, os.O_RDWR)
        if self._pool is not None:
            self._pool = ThreadPoolExecutor(self._threads)


class FilePerPageSide:
    """One file per page, written under a temporary name then renamed (no fsync)."""

    name = "file-per-page"

    def __init__(self, root: Path, pages: Pages) -> None:
        self.root, self._pages = root, pages
        root.mkdir()

    def put(self, span: slice) -> None:
        for i in range(*span.indices(len(self._pages.src))):
            tmp = self.root / f"{i}.tmp"
            with open(tmp, "wb") as f:
                f.write(self._pages.src[i])
            os.rename(tmp, self.root / str(i))

    def get(self, span: slice) -> None:
        for i in range(*span.indices(len(self._pages.dst))):
            with open(self.root / str(i), "rb", buffering=0) as f:
                f.readinto(self._pages.dst[i])

    def close(self) -> None:
        pass

    def reopen(self) -> None:
        pass


def open_sides(root: Path, pages: Pages, threads: int) -> list[Side]:
    """Every side, each in a fresh directory under ``root`` (created here)."""
    root.mkdir(parents=True)
    return [
        BackendSide("disk", root / "disk", pages, threads),
        RawSide(root / "raw", pages, threads),
        BackendSide("lmdb", root / "lmdb", pages, threads),
        FilePerPageSide(root / "file-per-page", pages),
    ]


def remove_sides(sides: list[Side]) -> None:
    for side in sides:
        side.close()
        shutil.rmtree(side.root, ignore_errors=True)
