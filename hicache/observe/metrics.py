"""Cache counters and latency histograms: a plain ``stats()`` snapshot, and
Prometheus over HTTP when asked (``hicache.observe.prometheus``)."""

from __future__ import annotations

import bisect
import dataclasses
import threading
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

Tier = Literal["device", "host", "storage"]
Link = Literal["d2h", "h2d", "h2s", "s2h"]
TIERS: tuple[Tier, ...] = ("device", "host", "storage")
LINKS: tuple[Link, ...] = ("d2h", "h2d", "h2s", "s2h")
# ``started`` counts prefetches submitted; each one that finishes adds exactly
# one of the others, so started == their sum + prefetches in flight. Only
# ``failed`` means something went wrong (see ``CacheStats``); ``declined``: the
# ``cost`` policy judged recomputing the pages storage held faster.
PREFETCH_OUTCOMES = (
    "started", "complete", "partial", "miss", "below_threshold", "declined", "failed"
)  # fmt: skip

# What a latency is measured for: a load-back (H2D submit -> completion applied),
# a backup (D2H submit -> completion applied), a prefetch wait (prefetch() ->
# release_prefetch(), when the request goes on), one storage backend call.
Latency = Literal[
    "load_back", "backup", "prefetch_wait", "storage_exists", "storage_get", "storage_put"
]
LATENCIES: tuple[Latency, ...] = (
    "load_back",
    "backup",
    "prefetch_wait",
    "storage_exists",
    "storage_get",
    "storage_put",
)
# Upper bounds (seconds) of the histogram buckets: 100 µs (a small copy) to
# 10 s (a storage timeout), roughly 2.5x apart.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


@dataclass(frozen=True)
class CacheStats:
    """A snapshot of every counter since the cache was created.

    ``lookup_tokens`` counts the tokens ``match_prefix`` was asked about (hits
    on any tier plus misses). Token counts are per tier; ``*_bytes`` and
    ``*_errors`` per link (d2h: device->host backups, h2d: load-backs, h2s:
    storage writes, s2h: prefetches).
    """

    requests: int = 0
    lookup_tokens: int = 0
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
    prefetch_miss: int = 0
    prefetch_below_threshold: int = 0
    prefetch_declined: int = 0
    prefetch_failed: int = 0
    prefetch_cuts: int = 0
    storage_wait_timeouts: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Histogram:
    """Observations of one latency: ``counts[i]`` fell in ``(bounds[i-1],
    bounds[i]]``, the last count past the last bound; ``total_s`` is their sum."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    total_s: float

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[int]:
        """Observations <= each bound, then all of them (Prometheus's ``le``)."""
        out, running = [], 0
        for n in self.counts:
            running += n
            out.append(running)
        return out


class CacheMetrics:
    """Mutable counters behind ``CacheStats``, and latency histograms.

    The owner thread records; ``snapshot()``, ``histograms()`` and the
    Prometheus collector may read from other threads, so every update and read
    holds a lock. Raises KeyError for an unknown counter or latency and
    ValueError for a negative or non-finite duration.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = {f.name: 0 for f in dataclasses.fields(CacheStats)}
        self._buckets = {k: [0] * (len(LATENCY_BUCKETS) + 1) for k in LATENCIES}
        self._sums = dict.fromkeys(LATENCIES, 0.0)

    def add(self, name: str, amount: int = 1) -> None:
        """Add to counter ``name`` (a CacheStats field)."""
        if name not in self._values:
            raise KeyError(f"unknown counter {name!r}")
        with self._lock:
            self._values[name] += amount

    def record_match(self, device: int, host: int, storage: int, asked: int) -> None:
        with self._lock:
            v = self._values
            v["requests"] += 1
            v["lookup_tokens"] += asked
            v["hit_tokens_device"] += device
            v["hit_tokens_host"] += host
            v["hit_tokens_storage"] += storage
            v["miss_tokens"] += max(asked - device - host - storage, 0)

    def record_transfer(self, link: Link, nbytes: int, ok: bool) -> None:
        with self._lock:
            self._values[f"bytes_{link}"] += nbytes
            if not ok:
                self._values[f"errors_{link}"] += 1

    def observe_latency(self, kind: Latency, seconds: float) -> None:
        """Count one ``kind`` operation that took ``seconds``."""
        if kind not in self._buckets:
            raise KeyError(f"unknown latency {kind!r}; known: {LATENCIES}")
        if not 0.0 <= seconds < float("inf"):
            raise ValueError(f"latency must be finite and >= 0, got {seconds}")
        slot = bisect.bisect_left(LATENCY_BUCKETS, seconds)
        with self._lock:
            self._buckets[kind][slot] += 1
            self._sums[kind] += seconds

    def snapshot(self) -> CacheStats:
        with self._lock:
            return CacheStats(**self._values)

    def histograms(self) -> MappingProxyType[Latency, Histogram]:
        """A snapshot of every latency histogram, keyed by kind."""
        with self._lock:
            return MappingProxyType(
                {
                    k: Histogram(LATENCY_BUCKETS, tuple(self._buckets[k]), self._sums[k])
                    for k in LATENCIES
                }
            )
