"""Cache counters: a plain ``stats()`` snapshot, and Prometheus over HTTP when asked."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Literal

Tier = Literal["device", "host", "storage"]
Link = Literal["d2h", "h2d", "h2s", "s2h"]
TIERS: tuple[Tier, ...] = ("device", "host", "storage")
LINKS: tuple[Link, ...] = ("d2h", "h2d", "h2s", "s2h")
PREFETCH_OUTCOMES = ("started", "complete", "partial", "failed", "below_threshold")


@dataclass(frozen=True)
class CacheStats:
    """A snapshot of every counter since the cache was created.

    Token counts are per tier; ``*_bytes`` and ``*_errors`` per link
    (d2h: device->host backups, h2d: load-backs, h2s: storage writes,
    s2h: prefetches).
    """

    requests: int = 0
    matched_tokens: int = 0
    hit_tokens_device: int = 0
    hit_tokens_host: int = 0
    hit_tokens_storage: int = 0
    miss_tokens: int = 0
    inserted_tokens: int = 0
    evicted_tokens_device: int = 0
    demoted_tokens_device: int = 0
    evicted_tokens_host: int = 0
    bytes_d2h: int = 0
    bytes_h2d: int = 0
    bytes_h2s: int = 0
    bytes_s2h: int = 0
    errors_d2h: int = 0
    errors_h2d: int = 0
    errors_h2s: int = 0
    errors_s2h: int = 0
    prefetch_started: int = 0
    prefetch_complete: int = 0
    prefetch_partial: int = 0
    prefetch_failed: int = 0
    prefetch_below_threshold: int = 0
    storage_wait_timeouts: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class CacheMetrics:
    """Mutable counters behind ``CacheStats``.

    The owner thread records; ``snapshot()`` and the Prometheus collector may
    read from other threads, so updates and reads hold a lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = {f.name: 0 for f in dataclasses.fields(CacheStats)}

    def add(self, name: str, amount: int = 1) -> None:
        """Add to counter ``name`` (a CacheStats field); KeyError for others."""
        if name not in self._values:
            raise KeyError(f"unknown counter {name!r}")
        with self._lock:
            self._values[name] += amount

    def record_match(self, device: int, host: int, storage: int, asked: int) -> None:
        with self._lock:
            v = self._values
            v["requests"] += 1
            v["matched_tokens"] += asked
            v["hit_tokens_device"] += device
            v["hit_tokens_host"] += host
            v["hit_tokens_storage"] += storage
            v["miss_tokens"] += max(asked - device - host - storage, 0)

    def record_transfer(self, link: Link, nbytes: int, ok: bool) -> None:
        with self._lock:
            self._values[f"bytes_{link}"] += nbytes
            if not ok:
                self._values[f"errors_{link}"] += 1

    def snapshot(self) -> CacheStats:
        with self._lock:
            return CacheStats(**self._values)
