"""ByteLRU: the daemon's in-memory page cache, bounded in bytes, with two-read admission."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import NamedTuple

from storage_backends.remote.protocol import Frame

# Charged per entry on top of the record, so that many tiny pages also respect the bound:
# the key and record objects, the OrderedDict slot and node, allocator rounding (measured).
ENTRY_OVERHEAD = 256
# Keys read once and not cached that the tier remembers (``admit``): one per this much
# capacity (at least MIN_GHOSTS), each ~150 bytes (0.2 % of the capacity they stand for).
GHOST_SPAN = 64 << 10
MIN_GHOSTS = 64


class LruSize(NamedTuple):
    entries: int
    bytes_used: int
    evictions: int


class ByteLRU:
    """Key → page record, least recently used first out once ``capacity`` bytes are exceeded.

    Thread-safe (one lock). Records are kept as given, never copied here.
    ``generation`` changes on every removal so that a reader can tell that a delete
    raced its read-through. ``admit`` decides which records read from the store are
    worth caching: those read a second time (a page read once, as most of a bulk
    transfer is, would only pass through: copying it into fresh memory costs more CPU
    than reading it from the store again).
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._pages: OrderedDict[bytes, Frame] = OrderedDict()
        self._ghosts: OrderedDict[bytes, None] = OrderedDict()  # read once, not cached
        self._max_ghosts = max(MIN_GHOSTS, capacity // GHOST_SPAN)
        self._bytes = 0
        self._evictions = 0
        self._generation = 0
        self._lock = threading.Lock()

    @property
    def generation(self) -> int:
        return self._generation

    def get(self, key: bytes) -> Frame | None:
        """The record of ``key`` (made most recently used), or None."""
        with self._lock:
            record = self._pages.get(key)
            if record is not None:
                self._pages.move_to_end(key)
            return record

    def __contains__(self, key: bytes) -> bool:
        with self._lock:
            return key in self._pages

    def admit(self, key: bytes) -> bool:
        """Whether the record of ``key``, just read from the store, should be cached now:
        True on its second read while it is remembered (it is then forgotten); False on a
        first read, which remembers it (the oldest remembered key is forgotten first).
        Mutates the remembered keys only."""
        with self._lock:
            if key in self._ghosts:
                del self._ghosts[key]
                return True
            self._ghosts[key] = None
            if len(self._ghosts) > self._max_ghosts:
                self._ghosts.popitem(last=False)
            return False

    def admits(self, nbytes: int) -> bool:
        """Whether a record of ``nbytes`` could be cached at all (it fits the capacity)."""
        return nbytes + ENTRY_OVERHEAD <= self._capacity

    def put(self, key: bytes, record: Frame, generation: int | None = None) -> bool:
        """Insert (or refresh) ``key``; evicts as needed. With ``generation``, only if no
        removal happened since it was read. Returns whether the record is now cached."""
        size = len(record) + ENTRY_OVERHEAD
        with self._lock:
            if size > self._capacity or (generation not in (None, self._generation)):
                return False
            old = self._pages.pop(key, None)
            if old is not None:
                self._bytes -= len(old) + ENTRY_OVERHEAD
            self._pages[key] = record
            self._bytes += size
            while self._bytes > self._capacity:
                _, evicted = self._pages.popitem(last=False)
                self._bytes -= len(evicted) + ENTRY_OVERHEAD
                self._evictions += 1
            return True

    def pop(self, key: bytes) -> bool:
        """Remove ``key``; return whether it was cached."""
        with self._lock:
            self._generation += 1
            record = self._pages.pop(key, None)
            if record is None:
                return False
            self._bytes -= len(record) + ENTRY_OVERHEAD
            return True

    def size(self) -> LruSize:
        with self._lock:
            return LruSize(len(self._pages), self._bytes, self._evictions)
