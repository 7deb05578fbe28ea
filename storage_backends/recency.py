"""PendingTouches: recency updates of read pages, queued until the next write.

A hit must move its page to the LRU's young end, but a write transaction per
GET batch would cost more than the read; backends whose recency lives in a
store (``lmdb``, ``disk``) queue touches here and apply them inside their next
write transaction, or on their own once ``FLUSH_AT`` are pending.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

FLUSH_AT = 4096  # pending touches worth a write transaction of their own


class PendingTouches:
    """Keys read since the last flush, oldest touch first; a key touched again
    moves to the end. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: OrderedDict[bytes, None] = OrderedDict()

    def add(self, keys: Sequence[bytes]) -> int:
        """Queue ``keys``; return how many are pending now."""
        with self._lock:
            for key in keys:
                self._keys[key] = None
                self._keys.move_to_end(key)
            return len(self._keys)

    def take(self) -> list[bytes]:
        """Every pending key, oldest touch first; the queue is left empty."""
        with self._lock:
            keys = list(self._keys)
            self._keys.clear()
        return keys
