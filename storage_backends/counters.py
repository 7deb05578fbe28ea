"""Thread-safe event counters shared by the backends' ``stats()``."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

from storage_backends.base import StorageStats


class StatCounters:
    """Totals of hits, misses, puts, … since creation; safe to update from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0
        self._puts = 0
        self._put_failures = 0
        self._evictions = 0
        self._corrupt = 0
        self._deletes = 0
        self._errors = 0
        self._quarantined = 0
        # Bounded: a backend nobody takes removals from must not grow without end.
        self._removed: deque[bytes] = deque(maxlen=1 << 16)

    def record_get(self, hits: int, misses: int, corrupt: int) -> None:
        with self._lock:
            self._hits += hits
            self._misses += misses
            self._corrupt += corrupt

    def record_put(self, puts: int, failures: int, evictions: int) -> None:
        with self._lock:
            self._puts += puts
            self._put_failures += failures
            self._evictions += evictions

    def record_evictions(self, evictions: int) -> None:
        with self._lock:
            self._evictions += evictions

    def record_deletes(self, deletes: int) -> None:
        with self._lock:
            self._deletes += deletes

    def record_error(self) -> None:
        with self._lock:
            self._errors += 1

    def record_quarantine(self) -> None:
        with self._lock:
            self._quarantined += 1

    def note_removed(self, keys: Iterable[bytes]) -> None:
        """Remember keys this backend removed (evicted, deleted, found corrupt)."""
        with self._lock:
            self._removed.extend(keys)

    def take_removed(self) -> list[bytes]:
        """Keys removed since the last call (the most recent 65,536 at most)."""
        with self._lock:
            out = list(self._removed)
            self._removed.clear()
        return out

    def snapshot(self, entries: int, bytes_used: int, capacity_bytes: int) -> StorageStats:
        """Combine the counters with the store's current size."""
        with self._lock:
            return StorageStats(
                entries=entries,
                bytes_used=bytes_used,
                capacity_bytes=capacity_bytes,
                hits=self._hits,
                misses=self._misses,
                puts=self._puts,
                put_failures=self._put_failures,
                evictions=self._evictions,
                corrupt=self._corrupt,
                deletes=self._deletes,
                errors=self._errors,
                quarantined=self._quarantined,
            )
