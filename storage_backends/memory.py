"""MemoryBackend: a bounded in-process LRU of encoded pages (tests, the daemon's front tier)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

from storage_backends.base import StorageStats
from storage_backends.batch import check_batch, check_keys
from storage_backends.config import StorageConfig
from storage_backends.counters import StatCounters
from storage_backends.errors import StorageClosedError
from storage_backends.page_format import Verdict, encode_page
from storage_backends.scatter import Runs, check_scatter, copy_verified_runs


class _Inserted(NamedTuple):
    stored: bool
    evictions: int


class MemoryBackend:
    """Pages (header + payload, as in the persistent stores) in an LRU bounded by max_bytes.

    One lock guards the index; checksums and copies run outside it so that
    concurrent readers overlap.
    """

    def __init__(self, config: StorageConfig) -> None:
        self._capacity = config.max_bytes
        self._max_page_bytes = config.max_page_bytes
        self._pages: OrderedDict[bytes, bytes] = OrderedDict()
        self._bytes_used = 0
        self._lock = threading.Lock()
        self._counters = StatCounters()
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise StorageClosedError("MemoryBackend is closed")

    def exists(self, keys: Sequence[bytes]) -> int:
        self._check_open()
        check_keys(keys)
        with self._lock:
            for count, key in enumerate(keys):
                if key not in self._pages:
                    return count
        return len(keys)

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        self._check_open()
        check_keys(keys)
        with self._lock:
            return [key in self._pages for key in keys]

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        self._check_open()
        return self._read(keys, [[view] for view in check_batch(keys, dst, writable=True)])

    def get_scatter(self, keys: Sequence[bytes], dst: list[Sequence[memoryview]]) -> list[bool]:
        self._check_open()
        return self._read(keys, check_scatter(keys, dst))

    def _read(self, keys: Sequence[bytes], dst: list[Runs]) -> list[bool]:
        """Verified copies of the pages into their runs (``get`` and ``get_scatter``)."""
        with self._lock:
            blobs = [self._pages.get(key) for key in keys]
            for key, blob in zip(keys, blobs, strict=True):
                if blob is not None:
                    self._pages.move_to_end(key)
        hits = [False] * len(keys)
        corrupt = 0
        for i, (key, blob, runs) in enumerate(zip(keys, blobs, dst, strict=True)):
            if blob is None:
                continue
            verdict = copy_verified_runs(memoryview(blob), key, runs)
            hits[i] = verdict is Verdict.OK
            if verdict.corrupt:
                corrupt += self._drop_if_same(key, blob)
        self._counters.record_get(sum(hits), len(keys) - sum(hits), corrupt)
        return hits

    def _drop_if_same(self, key: bytes, blob: bytes) -> int:
        """Delete a damaged page unless a writer replaced it meanwhile; return 1 if deleted."""
        with self._lock:
            if self._pages.get(key) is not blob:
                return 0
            del self._pages[key]
            self._bytes_used -= len(blob)
        self._counters.note_removed((key,))
        return 1

    def put(self, keys: Sequence[bytes], src: list[memoryview]) -> list[bool]:
        self._check_open()
        views = check_batch(keys, src, writable=False)
        results: list[bool] = []
        puts = failures = evictions = 0
        for key, view in zip(keys, views, strict=True):
            if key in self._pages:
                results.append(True)
                continue
            if len(view) > self._max_page_bytes:
                results.append(False)
                failures += 1
                continue
            # Encode outside the lock: it copies the whole payload.
            inserted = self._insert(key, encode_page(key, view))
            results.append(inserted.stored)
            puts += inserted.stored
            failures += not inserted.stored
            evictions += inserted.evictions
        self._counters.record_put(puts, failures, evictions)
        return results

    def _insert(self, key: bytes, blob: bytes) -> _Inserted:
        """Insert under the lock, evicting least-recently-used pages first."""
        if len(blob) > self._capacity:
            return _Inserted(False, 0)
        evicted = 0
        with self._lock:
            if key in self._pages:
                return _Inserted(True, 0)
            while self._bytes_used + len(blob) > self._capacity:
                old_key, old = self._pages.popitem(last=False)
                self._bytes_used -= len(old)
                self._counters.note_removed((old_key,))
                evicted += 1
            self._pages[key] = blob
            self._bytes_used += len(blob)
        return _Inserted(True, evicted)

    def delete(self, keys: Sequence[bytes]) -> int:
        self._check_open()
        check_keys(keys)
        removed = 0
        with self._lock:
            for key in keys:
                blob = self._pages.pop(key, None)
                if blob is not None:
                    self._bytes_used -= len(blob)
                    self._counters.note_removed((key,))
                    removed += 1
        self._counters.record_deletes(removed)
        return removed

    def take_removed(self) -> list[bytes]:
        return self._counters.take_removed()

    def stats(self) -> StorageStats:
        self._check_open()
        with self._lock:
            entries, used = len(self._pages), self._bytes_used
        return self._counters.snapshot(entries, used, self._capacity)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._pages.clear()
            self._bytes_used = 0
