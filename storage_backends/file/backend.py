"""FileBackend: one file per page under ``<path>/pages/ab/cd/<key hex>``.

Writes go to a temporary file in the target directory and are renamed into
place, so readers see a whole page or none. Reads check the page in a
per-thread scratch buffer before copying it into the caller's buffer, so a
damaged file never reaches ``dst``. Capacity is enforced by an in-memory LRU
index built on open from the files' modification times; recency of reads is
kept in memory only.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO, NamedTuple

from storage_backends.base import StorageStats
from storage_backends.batch import check_batch, check_keys
from storage_backends.config import StorageConfig
from storage_backends.counters import StatCounters
from storage_backends.errors import StorageClosedError, StorageOpenError
from storage_backends.log_limit import LogLimiter
from storage_backends.page_format import (
    HEADER_BYTES,
    KEY_BYTES,
    Verdict,
    build_header,
    check_header,
)
from storage_backends.scatter import Runs, check_scatter, copy_verified_runs, total
from storage_backends.store_dir import StoreMeta, prepare_store_dir, reconcile_meta

logger = logging.getLogger(__name__)

_META_FILE = "store.json"
_PAGES_DIR = "pages"
_TMP_PREFIX = ".tmp-"
# Other processes sharing the directory write pages this index never sees;
# rescanning after writing this share of max_bytes keeps the whole store
# within max_bytes * (1 + processes / _RESCAN_SHARE).
_RESCAN_SHARE = 8
# A temp file older than this belongs to a writer that died, not to a live
# writer in another process.
_STALE_TMP_S = 60.0


class _Read(NamedTuple):
    verdict: Verdict
    inode: int


class _PageFile(NamedTuple):
    key: bytes
    size: int
    mtime_ns: int


def _write_all(fd: int, parts: list[memoryview]) -> None:
    """Write every byte of ``parts`` to ``fd`` (writev may write less than asked)."""
    views = [part for part in parts if len(part)]
    while views:
        written = os.writev(fd, views)
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]


def _read_exact(file: BinaryIO, buf: memoryview) -> int:
    """Fill ``buf`` from ``file``; return the bytes read (fewer only at end of file)."""
    total = 0
    while total < len(buf):
        n = file.readinto(buf[total:])  # type: ignore[attr-defined]  # a buffered file
        if not n:
            break
        total += n
    return total


def _unlink(path: str) -> bool:
    """Remove ``path``; False if it was already gone or could not be removed (logged)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError:
        logger.warning("could not remove %s", path, exc_info=True)
        return False
    return True


def _load_meta(path: Path) -> StoreMeta | None:
    try:
        raw = json.loads(path.read_text())
        return StoreMeta(int(raw["format_version"]), str(raw["fingerprint"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StorageOpenError(f"{path}: unreadable store metadata: {exc}") from exc


def _save_meta(path: Path, meta: StoreMeta) -> None:
    tmp = path.with_name(_TMP_PREFIX + path.name)
    try:
        tmp.write_text(json.dumps(meta._asdict()))
        os.replace(tmp, path)
    except OSError as exc:
        raise StorageOpenError(f"{path}: cannot write store metadata: {exc}") from exc


def _page_files(pages: Path) -> Iterator[os.DirEntry[str]]:
    """Every file two directory levels below ``pages``."""
    for level1 in os.scandir(pages):
        if level1.is_dir():
            for level2 in os.scandir(level1.path):
                if level2.is_dir():
                    yield from os.scandir(level2.path)


def page_key(entry: os.DirEntry[str]) -> bytes | None:
    """The page key a file of the store is named by; None for a temp or foreign file."""
    if entry.name.startswith(_TMP_PREFIX):
        return None
    try:
        key = bytes.fromhex(entry.name)
    except ValueError:
        return None
    return key if len(key) == KEY_BYTES and entry.is_file() else None


def page_files(root: Path) -> Iterator[tuple[bytes, os.DirEntry[str]]]:
    """(key, entry) of every page file in the store at ``root`` (read only)."""
    for entry in _page_files(root / _PAGES_DIR):
        key = page_key(entry)
        if key is not None:
            yield key, entry


def _stat(entry: os.DirEntry[str]) -> os.stat_result | None:
    """The entry's stat, or None if another thread or process removed it meanwhile."""
    try:
        return entry.stat()
    except FileNotFoundError:
        return None


def _scan(pages: Path) -> OrderedDict[bytes, int]:
    """Index of stored pages (key → file size), oldest modification first.

    Removes temporary files left by writers that died mid-write (old enough
    that no live writer in another process can still own them).
    """
    found: list[_PageFile] = []
    stale = ignored = 0
    now_ns = time.time_ns()
    for entry in _page_files(pages):
        stat = _stat(entry)
        if stat is None:
            continue
        if entry.name.startswith(_TMP_PREFIX):
            if now_ns - stat.st_mtime_ns > _STALE_TMP_S * 1e9:
                stale += _unlink(entry.path)
            continue
        key = page_key(entry)
        if key is None:
            ignored += 1
            continue
        found.append(_PageFile(key, stat.st_size, stat.st_mtime_ns))
    if stale or ignored:
        logger.info("%s: removed %d stale temp files, ignored %d others", pages, stale, ignored)
    found.sort(key=lambda page: page.mtime_ns)
    return OrderedDict((page.key, page.size) for page in found)


class FileBackend:
    """One file per page, LRU-bounded by ``max_bytes`` through an in-memory index.

    The filesystem is the truth for presence (several processes may share a
    directory); the index, guarded by a lock, only drives eviction and stats.
    """

    def __init__(self, config: StorageConfig) -> None:
        self._config = config
        root = prepare_store_dir(config)
        meta_path = root / _META_FILE
        _save_meta(meta_path, reconcile_meta(_load_meta(meta_path), config))
        pages = root / _PAGES_DIR
        try:
            pages.mkdir(exist_ok=True)
            self._index = _scan(pages)
        except OSError as exc:
            raise StorageOpenError(f"{pages}: cannot use page directory: {exc}") from exc
        self._pages_dir = str(pages)
        self._bytes_used = sum(self._index.values())
        self._lock = threading.Lock()
        self._scratch = threading.local()
        self._counters = StatCounters()
        self._closed = False
        self._written_since_scan = 0
        # Keys removed while a rescan runs: its listing may predate the removal.
        self._scans = 0
        self._gone_while_scanning: set[bytes] = set()
        self._log = LogLimiter(logger)
        self._counters.record_evictions(self._evict_to(config.max_bytes, b""))

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosedError("FileBackend is closed")

    def _path(self, key: bytes) -> str:
        name = key.hex()
        return os.path.join(self._pages_dir, name[:2], name[2:4], name)

    def exists(self, keys: Sequence[bytes]) -> int:
        self._check_open()
        check_keys(keys)
        for count, key in enumerate(keys):
            if not os.path.exists(self._path(key)):
                return count
        return len(keys)

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        self._check_open()
        check_keys(keys)
        return [os.path.exists(self._path(key)) for key in keys]

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        self._check_open()
        return self._read_runs(keys, [[view] for view in check_batch(keys, dst, writable=True)])

    def get_scatter(self, keys: Sequence[bytes], dst: list[Sequence[memoryview]]) -> list[bool]:
        self._check_open()
        return self._read_runs(keys, check_scatter(keys, dst))

    def _read_runs(self, keys: Sequence[bytes], dst: list[Runs]) -> list[bool]:
        """Verified copies of the pages into their runs (``get`` and ``get_scatter``)."""
        hits = [False] * len(keys)
        corrupt = 0
        for i, (key, runs) in enumerate(zip(keys, dst, strict=True)):
            read = self._read_page(key, runs)
            if read is None:
                continue
            hits[i] = read.verdict is Verdict.OK
            if hits[i]:
                self._note_use(key, HEADER_BYTES + total(runs))
            elif read.verdict.corrupt:
                corrupt += self._drop_damaged(key, read)
        n_hits = sum(hits)
        self._counters.record_get(n_hits, len(keys) - n_hits, corrupt)
        return hits

    def _scratch_view(self, size: int) -> memoryview:
        """A per-thread buffer of at least ``size`` bytes, reused across calls."""
        buf: bytearray | None = getattr(self._scratch, "buf", None)
        if buf is None or len(buf) < size:
            buf = bytearray(size)
            self._scratch.buf = buf
        return memoryview(buf)[:size]

    def _read_page(self, key: bytes, runs: Runs) -> _Read | None:
        """Check the page file and copy its payload into ``runs`` if intact; None if absent."""
        path = self._path(key)
        size = total(runs)
        want = HEADER_BYTES + size
        try:
            with open(path, "rb", buffering=0) as file:
                stat = os.fstat(file.fileno())
                if stat.st_size != want:
                    header = file.read(HEADER_BYTES)
                    verdict = check_header(header, key, stat.st_size - HEADER_BYTES, size)
                    return _Read(verdict, stat.st_ino)
                scratch = self._scratch_view(want)
                got = _read_exact(file, scratch)
        except FileNotFoundError:
            self._forget(key)
            return None
        except OSError as exc:
            self._log.failure(f"could not read page files in {self._pages_dir}", exc)
            return None
        return _Read(copy_verified_runs(scratch[:got], key, runs), stat.st_ino)

    def _drop_damaged(self, key: bytes, read: _Read) -> int:
        """Delete a damaged page file unless a writer replaced it meanwhile; 1 if deleted."""
        path = self._path(key)
        try:
            if os.stat(path).st_ino != read.inode:
                return 0
        except FileNotFoundError:
            return 0
        logger.warning("deleting damaged page file %s (%s)", path, read.verdict.value)
        removed = _unlink(path)
        self._forget(key)
        if removed:
            self._counters.note_removed((key,))
        return int(removed)

    def _note_use(self, key: bytes, size: int) -> None:
        with self._lock:
            if key in self._index:
                self._index.move_to_end(key)
                return
        # Written by another process sharing the directory: start accounting for it.
        self._counters.record_evictions(self._account(key, size))

    def _forget(self, key: bytes) -> None:
        with self._lock:
            self._note_gone(key)
            size = self._index.pop(key, None)
            if size is not None:
                self._bytes_used -= size

    def _note_gone(self, key: bytes) -> None:
        """Keep a rescan in progress from reviving ``key``; the caller holds the lock."""
        if self._scans:
            self._gone_while_scanning.add(key)

    def put(self, keys: Sequence[bytes], src: list[memoryview]) -> list[bool]:
        self._check_open()
        views = check_batch(keys, src, writable=False)
        results: list[bool] = []
        puts = failures = evictions = 0
        for key, view in zip(keys, views, strict=True):
            size = HEADER_BYTES + len(view)
            path = self._path(key)
            if len(view) > self._config.max_page_bytes or size > self._config.max_bytes:
                ok = False
            elif os.path.exists(path):
                self._note_use(key, size)
                ok = True
            else:
                ok = self._write_page(path, key, view)
                puts += ok
                evictions += self._account(key, size) if ok else 0
            results.append(ok)
            failures += not ok
        self._counters.record_put(puts, failures, evictions)
        return results

    def _write_page(self, path: str, key: bytes, view: memoryview) -> bool:
        """Write header+payload to a temp file and rename it to ``path``; False on OSError."""
        tmp = ""
        try:
            directory = os.path.dirname(path)
            os.makedirs(directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=_TMP_PREFIX)
            try:
                _write_all(fd, [memoryview(build_header(key, view)), view])
                if self._config.sync_level.fsync_index:  # its data is its index
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError as exc:
            self._log.failure(f"could not store page files in {self._pages_dir}", exc)
            if tmp:
                _unlink(tmp)
            return False
        return True

    def _account(self, key: bytes, size: int) -> int:
        """Add a stored page to the index and evict beyond capacity; return evictions."""
        with self._lock:
            self._written_since_scan += size
            if key in self._index:
                self._index.move_to_end(key)
                return 0
            self._index[key] = size
            self._bytes_used += size
            rescan = self._written_since_scan * _RESCAN_SHARE >= self._config.max_bytes
        if rescan:
            self._rescan()
        return self._evict_to(self._config.max_bytes, key)

    def _rescan(self) -> None:
        """Re-read the directory (pages other processes wrote), keeping this
        process's recency order for the pages it knows."""
        with self._lock:
            self._scans += 1
        try:
            fresh = _scan(Path(self._pages_dir))
        except OSError as exc:
            fresh = None
            self._log.failure(f"could not rescan {self._pages_dir}", exc)
        with self._lock:
            self._scans -= 1
            gone = self._gone_while_scanning
            if not self._scans:
                self._gone_while_scanning = set()
            if fresh is None:
                return
            for key in gone:
                fresh.pop(key, None)
            for key in self._index:
                if key in fresh:
                    fresh.move_to_end(key)
            self._index, self._bytes_used = fresh, sum(fresh.values())
            self._written_since_scan = 0

    def _evict_to(self, limit: int, keep: bytes) -> int:
        """Remove least-recently-used pages (never ``keep``) until at most ``limit`` bytes."""
        victims: list[bytes] = []
        with self._lock:
            while self._bytes_used > limit and self._index:
                key, size = next(iter(self._index.items()))
                if key == keep:
                    break
                del self._index[key]
                self._bytes_used -= size
                self._note_gone(key)
                victims.append(key)
        # Only files this call removed count: another thread or process may
        # have deleted (or evicted) the same page already.
        removed = [key for key in victims if _unlink(self._path(key))]
        self._counters.note_removed(removed)
        return len(removed)

    def delete(self, keys: Sequence[bytes]) -> int:
        self._check_open()
        check_keys(keys)
        removed = 0
        for key in keys:
            if _unlink(self._path(key)):
                removed += 1
                self._counters.note_removed((key,))
            self._forget(key)
        self._counters.record_deletes(removed)
        return removed

    def take_removed(self) -> list[bytes]:
        return self._counters.take_removed()

    def stats(self) -> StorageStats:
        self._check_open()
        with self._lock:
            entries, used = len(self._index), self._bytes_used
        return self._counters.snapshot(entries, used, self._config.max_bytes)

    def close(self) -> None:
        self._closed = True
