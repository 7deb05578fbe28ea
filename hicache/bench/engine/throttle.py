"""A store behind a link of a chosen bandwidth: ``ThrottledBackend``.

``hicache bench engine --sweep`` serves the same storage hit from a store
throttled to a range of bandwidths, from far slower than the engine's
prefill to far faster. The wrapper answers every call from the store it
wraps, then holds a read back until the bytes it returned would have
crossed the link: one link shared by every caller (reads queue behind each
other as on a real one), ``latency_s`` per call, ``bytes_per_s`` for the
pages a read found. Writes, deletes and lookups pass at the link's latency
only (the sweep measures loads). ``set_rate`` changes the bandwidth while
serving; ``sleep``/``clock`` are injected so that tests run on a fake clock.
Thread-safe as the wrapped store is; the link's bookkeeping holds a lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from storage_backends import StorageBackend, StorageStats


class ThrottledBackend:
    """``inner`` behind a link of ``bytes_per_s`` and ``latency_s`` a call."""

    def __init__(
        self,
        inner: StorageBackend,
        bytes_per_s: float,
        latency_s: float = 0.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if latency_s < 0:
            raise ValueError(f"latency_s must be >= 0, got {latency_s}")
        self.inner = inner
        self.latency_s = latency_s
        self._sleep, self._clock = sleep, clock
        self._lock = threading.Lock()
        self._free_at = 0.0  # when the link has sent everything queued on it
        self.bytes_per_s = 0.0
        self.set_rate(bytes_per_s)

    def set_rate(self, bytes_per_s: float) -> None:
        """The link's bandwidth from now on (ValueError unless > 0)."""
        if not bytes_per_s > 0:
            raise ValueError(f"bytes_per_s must be > 0, got {bytes_per_s}")
        with self._lock:
            self.bytes_per_s = bytes_per_s

    def _cross(self, nbytes: int) -> None:
        """Wait until ``nbytes`` (after those queued before them) crossed the link."""
        with self._lock:
            now = self._clock()
            done = max(now, self._free_at) + self.latency_s + nbytes / self.bytes_per_s
            self._free_at = done
        if done > now:
            self._sleep(done - now)

    def exists(self, keys: Sequence[bytes]) -> int:
        self._cross(0)
        return self.inner.exists(keys)

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        self._cross(0)
        return self.inner.contains(keys)

    def get(self, keys: Sequence[bytes], dst: list[memoryview]) -> list[bool]:
        hits = self.inner.get(keys, dst)
        self._cross(sum(len(d) for d, hit in zip(dst, hits, strict=True) if hit))
        return hits

    def put(self, keys: Sequence[bytes], src: list[memoryview]) -> list[bool]:
        return self.inner.put(keys, src)

    def delete(self, keys: Sequence[bytes]) -> int:
        return self.inner.delete(keys)

    def take_removed(self) -> list[bytes]:
        return self.inner.take_removed()

    def stats(self) -> StorageStats:
        return self.inner.stats()

    def close(self) -> None:
        self.inner.close()
